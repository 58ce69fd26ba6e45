"""OpenJMS 0.7.6+: one canonical message per message handle.

Facts: reference/legacy-sources.md §2. A queue message has one handle (its consumer row is
named after the queue); a topic message has one handle per durable subscriber, and each becomes
a message for that subscriber's route. Handles have no increasing key, and an OpenJMS store
holds its pending backlog only, so this source is scanned whole each pass and the ledger says
which handles are new (`cursor = "scan"`): a late commit is simply seen on a later pass.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

import orjson
import sqlalchemy as sa

from bridge.codecs.echo import ECHO_HEADER
from bridge.codecs.openjms_blob import BlobError, JmsMessage, decode
from bridge.config import JobConfig
from bridge.db import binary_rows
from bridge.errors import BadRow, SourceSchemaError
from bridge.model import CanonicalMessage, PlainMessage
from bridge.schemas.openjms import SCHEMA_VERSION, is_queue, tables
from bridge.schemas.text_in import among
from bridge.sources import openjms_giveback, plain_lane
from bridge.sources.base import ScanSource, SourceRow, Subscription, dict_rows, tuple_after
from bridge.sources.openjms_values import CONTENT_TYPES, DEFAULT_TYPES, epoch_ms, json_value, property_text
from bridge.timefmt import UTC, utcnow


class OpenJMSSource(ScanSource):
    system: ClassVar[str] = "openjms"
    identity_fields: ClassVar[frozenset[str]] = frozenset({"messageid", "consumerid", "consumer", "message_row"})

    def __init__(self, job: JobConfig, engine: sa.Engine, queue: str, database: str) -> None:
        super().__init__(job, engine, queue, database)
        self.t = tables(job.source.schema_)
        self.prefix = "JMS."
        self.mapping: Any = None

    def configure(self, mapping: Any) -> None:
        self.prefix = mapping.jms.header_prefix
        self.mapping = mapping

    # -- schema ----------------------------------------------------------------------------
    def check_schema(self, conn: sa.Connection) -> None:
        insp = sa.inspect(conn)
        schema = self.job.source.schema_
        missing = [n for n in ("system_data", "destinations", "messages", "message_handles", "consumers")
                   if not insp.has_table(n, schema=schema)]
        if missing:
            raise SourceSchemaError(f"not an OpenJMS 0.7.6+ database: tables {', '.join(missing)} are missing")
        columns = {c["name"].lower() for c in insp.get_columns("messages", schema=schema)}
        if "messagetype" in columns:
            raise SourceSchemaError("this OpenJMS database has the pre-0.7.6 schema (messages.messageType); "
                                    "migrate it with OpenJMS's `dbtool -migrate` first")
        sd = self.t["system_data"]
        version = conn.execute(sa.select(sd.c.version).where(sd.c.id == 1)).scalar_one_or_none()
        if version is None or version.strip() != SCHEMA_VERSION:
            raise SourceSchemaError(f"OpenJMS schema version {version!r} is not supported: qbridge reads "
                                    f"{SCHEMA_VERSION} (written by OpenJMS 0.7.6 to 0.7.7)")
        if self._destination(conn) is None:
            raise SourceSchemaError(f"OpenJMS destination {self.queue!r} does not exist")

    def _destination(self, conn: sa.Connection) -> tuple[int, bool] | None:
        d = self.t["destinations"]
        rows = conn.execute(sa.select(d.c.destinationid, d.c.isqueue).where(d.c.name == self.queue)
                            .order_by(d.c.destinationid).limit(2)).all()
        if len(rows) > 1:
            # OpenJMS keeps one row a name; PostgreSQL's create script does not enforce it. Read
            # from one, the other's handles would be neither delivered nor counted.
            raise SourceSchemaError(f"OpenJMS destinations {int(rows[0][0])} and {int(rows[1][0])} are both named "
                                    f"{self.queue!r}: qbridge reads a destination by its name; remove or rename the "
                                    "one OpenJMS does not use (destinations.name)")
        return None if not rows else (int(rows[0][0]), is_queue(rows[0][1]))

    # -- reading ---------------------------------------------------------------------------
    def _handles(self, with_blob: bool) -> sa.Select:
        h, c, m, d = (self.t[n] for n in ("message_handles", "consumers", "messages", "destinations"))
        cols = [h.c.messageid, h.c.consumerid, h.c.delivered, h.c.acceptedtime, h.c.sequencenumber,
                c.c.name.label("consumer"), m.c.messageid.label("message_row")]
        if with_blob:
            cols += [m.c.messageblob, m.c.expirytime, m.c.createtime, d.c.isqueue]
        return (
            sa.select(*cols)
            .select_from(h)
            .join(d, d.c.destinationid == h.c.destinationid)
            .outerjoin(c, sa.and_(c.c.consumerid == h.c.consumerid, c.c.destinationid == h.c.destinationid))
            .outerjoin(m, m.c.messageid == h.c.messageid)
            .where(d.c.name == self.queue)
            .order_by(h.c.acceptedtime, h.c.sequencenumber, h.c.messageid, h.c.consumerid)
        )

    @staticmethod
    def key_of(message_id: str, consumer_id: Any) -> str:
        return f"{message_id}#{int(consumer_id)}"

    def keyset(self) -> sa.Subquery:
        """Handles of this destination by consumer and message id: the order of OpenJMS's own
        index message_handles_pk (destinationId, consumerId, messageId), so that slices and
        their pages are index range scans, not a sort of the whole destination per page."""
        h = self.t["message_handles"]
        return sa.select(h.c.consumerid.label("c"), h.c.messageid.label("m")).where(self._here(h)).subquery()

    def _here(self, h: sa.Table) -> sa.ColumnElement[bool]:
        """Handles of this destination, by its id as one value: joined by name, the planner could
        not tell that the index's order is the keyset's, and read every handle after a page's
        start and sorted them for each page (issue 49: 980 ms a page at 2M handles, 0.8 ms so)."""
        d = self.t["destinations"]
        return h.c.destinationid == sa.select(d.c.destinationid).where(d.c.name == self.queue) \
            .order_by(d.c.destinationid).limit(1).scalar_subquery()

    walks_oldest_first: ClassVar[bool] = False  # the keyset goes by consumer and message id

    def iter_aged(self, conn: sa.Connection, after: Sequence[Any] | None = None, page: int = 10_000
                  ) -> Iterator[tuple[str, tuple[int, int]]]:
        """Every handle in the keyset's order, aged by OpenJMS's delivery order (accepted first)."""
        h = self.t["message_handles"]
        stmt = sa.select(h.c.messageid, h.c.consumerid, h.c.acceptedtime, h.c.sequencenumber).where(self._here(h))
        if after is not None:
            stmt = stmt.where(tuple_after([h.c.consumerid, h.c.messageid], after, conn.dialect.name))
        stmt = stmt.order_by(h.c.consumerid, h.c.messageid).execution_options(stream_results=True, yield_per=page)
        for mid, cid, accepted, seq in conn.execute(stmt):
            yield self.key_of(mid, cid), (accepted if accepted is not None else -1, seq if seq is not None else -1)

    def aged_after(self, conn: sa.Connection, after: Sequence[Any] | None, limit: int
                   ) -> list[tuple[str, tuple[Any, ...]]]:
        """At most `limit` handles of this destination in delivery order (their age, then the
        keyset's order for equal ages: the order a walk's `Oldest` keeps), after the sort tuple
        `after`, each with its own sort tuple. No index OpenJMS ships has this order: the
        database reads the destination's handles and keeps the first `limit` (a top-N sort, in
        its own code), which a drain's refill costs instead of a walk through Python."""
        stmt = self.by_age(after, limit, conn.dialect.name)
        return [(self.key_of(mid, cid), (accepted, seq, int(cid), mid)) for mid, cid, accepted, seq in conn.execute(stmt)]

    def by_age(self, after: Sequence[Any] | None, limit: int, dialect: str) -> sa.Select:
        """The statement of `aged_after`."""
        h = self.t["message_handles"]
        never = sa.literal_column("-1", sa.BigInteger)  # the age a walk gives a NULL time, in the SQL's text
        order = [sa.func.coalesce(h.c.acceptedtime, never), sa.func.coalesce(h.c.sequencenumber, never),
                 h.c.consumerid, h.c.messageid]
        stmt = sa.select(h.c.messageid, h.c.consumerid, *order[:2]).where(self._here(h))
        if after is not None:
            stmt = stmt.where(tuple_after(order, after, dialect))
        return stmt.order_by(*order).limit(limit)

    @staticmethod
    def age_sort(age: tuple[int, int], key: str) -> tuple[Any, ...]:
        """The sort tuple of `aged_after` of a key a walk gave with its age."""
        mid, _, cid = key.rpartition("#")
        return (*age, int(cid), mid)

    def iter_sent(self, conn: sa.Connection) -> Iterator[tuple[str, datetime | None]]:
        """acceptedTime is when the server accepted the message, in epoch milliseconds."""
        for key, (accepted, _) in self.iter_aged(conn):
            yield key, (datetime.fromtimestamp(accepted / 1000, UTC) if accepted > 0 else None)

    def key_of_row(self, row: Sequence[Any]) -> str:
        return self.key_of(row[1], row[0])

    def fetch_keys(self, conn: sa.Connection, keys: Sequence[str], lock: bool) -> list[SourceRow]:
        if not keys:
            return []
        dest = self._destination(conn)
        if dest is None:
            return []
        h = self.t["message_handles"]
        wanted = set(keys)
        pairs = sorted({(int(cid), mid) for mid, _, cid in (k.rpartition("#") for k in keys)})
        rows: list[SourceRow] = []
        with binary_rows(conn):  # the message blobs as bytes, not hex twice their size
            for start in range(0, len(pairs), 500):
                chunk = pairs[start:start + 500]
                # destinationId = and consumerId IN, messageId IN: an index range scan with either
                # index OpenJMS ships (create scripts: destination, consumer, message; dbtool:
                # message, destination, consumer). messageId IN alone scanned the whole table.
                stmt = self._handles(True).where(h.c.destinationid == dest[0],
                                                 h.c.consumerid.in_(sorted({c for c, _ in chunk})),
                                                 among(h.c.messageid, sorted({m for _, m in chunk}), conn.dialect.name))
                for values in dict_rows(conn.execute(stmt)):
                    key = self.key_of(values["messageid"], values["consumerid"])
                    if key in wanted:  # a pair of another chunk matches this chunk's two lists too: taken once
                        wanted.discard(key)
                        rows.append(SourceRow(key=key, consumable=True, values=values))
        order = {k: i for i, k in enumerate(keys)}
        return sorted(rows, key=lambda r: order[r.key])

    # -- move mode -------------------------------------------------------------------------
    def lock_messages(self, conn: sa.Connection, mids: Sequence[str]) -> set[str]:
        """Locks the message rows of `mids` (sorted) and returns those stored. Taken, in this one
        order, before anything looks at their handles: two consumes of sibling handles of one
        topic message, and a rollback giving one back (openjms_giveback), then take turns on the
        message, each seeing the others' handles as committed, and never wait in a circle."""
        m = self.t["messages"]
        ordered = sorted(mids)
        stored: set[str] = set()
        for start in range(0, len(ordered), 500):
            stored.update(conn.execute(sa.select(m.c.messageid).where(m.c.messageid.in_(ordered[start:start + 500]))
                                       .order_by(m.c.messageid).with_for_update()
                                       .with_hint(m, "WITH (UPDLOCK, ROWLOCK)", "mssql")).scalars())
        return stored

    def consume(self, conn: sa.Connection, keys: Sequence[Any]) -> int:
        """As OpenJMS does: delete the handle, then the message once no handle refers to it."""
        if not keys:
            return 0
        dest = self._destination(conn)
        if dest is None:
            return 0
        h, m, c = self.t["message_handles"], self.t["messages"], self.t["consumers"]
        pairs = sorted({(int(cid), mid) for mid, _, cid in (str(k).rpartition("#") for k in keys)})
        mids = sorted({mid for _, mid in pairs})
        self.lock_messages(conn, mids)  # before any handle is touched
        done = 0
        for cid in sorted({cid for cid, _ in pairs}):
            held_by = [mid for c_, mid in pairs if c_ == cid]
            for start in range(0, len(held_by), 500):
                done += conn.execute(sa.delete(h).where(h.c.destinationid == dest[0], h.c.consumerid == cid,
                                                        h.c.messageid.in_(held_by[start:start + 500]))).rowcount
        # Handles still holding a message: looked up per consumer of the destination (index
        # seeks), never by messageId alone, which no index OpenJMS creates leads with.
        consumers = set(conn.execute(sa.select(c.c.consumerid).where(c.c.destinationid == dest[0])).scalars())
        consumers |= {cid for cid, _ in pairs}
        for start in range(0, len(mids), 500):
            chunk = mids[start:start + 500]
            # A locking read: the latest committed handles, under MariaDB's repeatable read too.
            held = set(conn.execute(sa.select(h.c.messageid).where(
                h.c.destinationid == dest[0], h.c.consumerid.in_(sorted(consumers)), h.c.messageid.in_(chunk))
                .with_for_update(read=True)).scalars())
            free = [mid for mid in chunk if mid not in held]
            if free:
                conn.execute(sa.delete(m).where(m.c.messageid.in_(free)))
        return done

    # -- giving consumed handles back (move-mode rollback: bridge.ledger.giveback, openjms_giveback) --
    gives_back: ClassVar[bool] = True
    marks_give_backs: ClassVar[bool] = True

    def give_back_delivered(self, conn: sa.Connection, key: str, table: str, delivered: dict[str, Any]
                            ) -> tuple[str, dict[str, Any] | None]:
        return openjms_giveback.rebuild(self, key, delivered)

    def give_back(self, conn: sa.Connection, owed: Sequence[Any]) -> tuple[list[str], int]:
        return openjms_giveback.give_back(self, conn, owed)

    def added_headers(self) -> frozenset[str]:
        return frozenset(self.prefix + n for n in ("ReplyToDestination", "Expiration", "Timestamp", "BodyNull"))

    def given_back_raw(self, owed: Any) -> dict[str, Any]:
        return openjms_giveback.given_back_raw(self, owed)

    # -- decoding --------------------------------------------------------------------------
    def decode(self, row: SourceRow) -> CanonicalMessage:
        v = row.values
        if v["message_row"] is None:
            raise BadRow(f"handle {row.key} refers to message {v['messageid']!r}, which is not in the messages table")
        blob = v["messageblob"]
        if blob is None:
            raise BadRow("messageBlob is NULL")
        try:
            jms = decode(bytes(blob))
        except BlobError as e:
            raise BadRow(f"messageBlob: {e}") from None
        return self._canonical(row, jms)

    def _canonical(self, row: SourceRow, jms: JmsMessage) -> CanonicalMessage:
        f = self._fields(row, jms)
        return self.message(row, state=f[0], destination=f[1], reply_to=f[2], correlation_id=f[3], enclosed_types=f[4],
                            content_type=f[5], time_sent=f[6], expires=f[7], priority=f[8], headers=f[9], body=f[10])

    def plain(self, row: SourceRow, message_id: str) -> PlainMessage | None:
        """The fast lane: a handle whose blob the reader takes, with no expiry and values the model
        would take as they are, as a PlainMessage; anything else goes through `decode`."""
        v = row.values
        blob = v["messageblob"]
        if v["message_row"] is None or blob is None:
            return None
        try:
            f = self._fields(row, decode(bytes(blob)))
        except (BlobError, BadRow):
            return None
        state, destination, reply_to, correlation_id, types, content_type, sent, expires, priority, headers, body = f
        if (state != "ready" or expires is not None or reply_to == "" or type(priority) is not int
                or not all(type(t) is str and t for t in types) or not all(type(h) is str for h in headers.values())):
            return None  # what the model would refuse, or has to judge: the validated path says
        return PlainMessage(state, message_id, self.system, self.database, self.queue, self.ledger_key(row), destination,
                            reply_to, correlation_id, types, content_type, sent, None, headers, body, None, priority)

    plain_columns = plain_lane.decoded_columns
    # The decoded lane saves only a row's envelope and write (each row is still decoded alone):
    # below this many rows its fixed cost is more (bench/lane_threshold.py, 2026-11-28).
    lane_min_rows: ClassVar[int] = 768

    def _fields(self, row: SourceRow, jms: JmsMessage) -> tuple:
        """What `decode` and `plain` both make of a handle and its message, in the order of
        `_canonical`'s keywords: state, destination, reply queue, correlation id, types,
        content type, time sent, expiry, priority, headers, body. (A tuple: this runs per row.)"""
        h = jms.headers
        consumer = row.values["consumer"]
        # The store says which destination the handle belongs to; the blob only says where it was sent.
        topic = not is_queue(row.values["isqueue"])
        destination = consumer if (topic and consumer) else self.queue
        expiration = h["JMSExpiration"] or 0
        expires = epoch_ms(expiration, "JMSExpiration") if expiration > 0 else None  # <= 0: never (overflowed TTLs are negative)
        state = "expired" if expires is not None and expires <= utcnow() else "ready"
        jms_type = h["JMSType"]
        # OpenJMS stamps the message kind as JMSType by default; only an application's own type names one.
        types = [jms_type] if jms_type and jms_type not in DEFAULT_TYPES else []
        reply = h["JMSReplyTo"]
        headers = {
            f"{self.prefix}MessageID": h["JMSMessageID"] or "",
            f"{self.prefix}Destination": (h["JMSDestination"] or {}).get("name", self.queue),
            f"{self.prefix}DeliveryMode": {1: "NON_PERSISTENT", 2: "PERSISTENT"}.get(h["JMSDeliveryMode"], str(h["JMSDeliveryMode"])),
            f"{self.prefix}Priority": str(h["JMSPriority"]),
            f"{self.prefix}Redelivered": "true" if row.values.get("delivered") else "false",
            f"{self.prefix}BodyKind": jms.message_type,
        }
        if jms_type:
            headers[f"{self.prefix}Type"] = jms_type
        if consumer and topic:
            headers[f"{self.prefix}Subscription"] = consumer
        if reply and reply["temporary"]:
            headers[f"{self.prefix}ReplyTo"] = reply["name"]  # a temporary queue no endpoint can answer
        # What only the blob knew, for a move-mode rollback to put back (bridge.sources.openjms_giveback).
        if reply:
            headers[f"{self.prefix}ReplyToDestination"] = f"{reply['kind']}:{reply['name']}"
        if not h["JMSTimestamp"]:
            headers[f"{self.prefix}Timestamp"] = "" if h["JMSTimestamp"] is None else "0"
        if expiration > 0:
            headers[f"{self.prefix}Expiration"] = str(expiration)
        props = jms.properties
        for name, prop in props.items():
            headers[f"{self.prefix}Property.{name}"] = property_text(prop)
        if ECHO_HEADER in props:  # written by a reverse job: the echo guard reads it under its own name
            headers[ECHO_HEADER] = property_text(props[ECHO_HEADER])
        if props:
            headers[f"{self.prefix}PropertyTypes"] = orjson.dumps({k: p["type"] for k, p in props.items()}).decode()
        body, content_type = self._body(jms, headers)
        return (state, destination, reply["name"] if reply and not reply["temporary"] else None, h["JMSCorrelationID"] or None,
                types, content_type, epoch_ms(h["JMSTimestamp"] or row.values.get("createtime") or 0, "JMSTimestamp"),
                expires, h["JMSPriority"], headers, body)

    def _body(self, jms: JmsMessage, headers: dict[str, str]) -> tuple[bytes, str | None]:
        b = jms.body
        kind = jms.message_type
        if "text" in b:
            if b["text"] is None:
                headers[f"{self.prefix}BodyNull"] = "true"  # getText() == null, not ""
            return (b["text"] or "").encode("utf-8", "surrogatepass"), CONTENT_TYPES[kind]
        if "map" in b:
            headers[f"{self.prefix}BodyTypes"] = orjson.dumps({k: v["type"] for k, v in b["map"].items()}).decode()
            return orjson.dumps({k: json_value(v) for k, v in b["map"].items()}), CONTENT_TYPES[kind]
        if "values" in b:
            headers[f"{self.prefix}BodyTypes"] = orjson.dumps([v["type"] for v in b["values"]]).decode()
            return orjson.dumps([json_value(v) for v in b["values"]]), CONTENT_TYPES[kind]
        if "base64" in b:
            return base64.b64decode(b["base64"]), CONTENT_TYPES[kind]
        return b"", None

    def subscriptions(self, conn: sa.Connection) -> list[Subscription]:
        """Durable subscriptions of this topic -> (subscriber name, topic name)."""
        dest = self._destination(conn)
        if dest is None or dest[1]:
            return []
        c = self.t["consumers"]
        names = conn.execute(sa.select(c.c.name).where(c.c.destinationid == dest[0])).scalars()
        return [Subscription(endpoint=n, topic=self.queue) for n in sorted(names)]
