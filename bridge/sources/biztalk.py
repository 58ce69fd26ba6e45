"""BizTalk MessageBox: one canonical message per work-queue entry of a configured host.

Facts: reference/legacy-sources.md §3 and shared/fixtures/biztalk. `<Host>Q` entries are ready
work; `<Host>Q_Suspended` entries with their `InstancesSuspended` row go to the error queue.
Entries have no increasing key, so this is a scan source (like OpenJMS): the ledger says which
entries are new. Message data stays in Spool / MessageParts / Parts / Fragments.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

import orjson
import sqlalchemy as sa

from bridge.codecs.biztalk import BizTalkFormatError, ContextFields, context_fields, decode_part
from bridge.codecs.biztalk_values import ERROR_NS, SYSTEM_NS
from bridge.config import JobConfig
from bridge.db import binary_rows, by_index
from bridge.errors import BadRow, SourceSchemaError
from bridge.model import CanonicalMessage, Failure, FailureInfo, Part, PlainMessage
from bridge.schemas.biztalk import OTHER_PREDICATES, tables
from bridge.sources import biztalk_fetch, biztalk_giveback, plain_lane
from bridge.sources.base import ScanSource, SourceRow, Subscription, tuple_after
from bridge.timefmt import local_to_utc, utcnow, zone

SHORT_NAMES = {
    SYSTEM_NS: "BTS",
    "http://schemas.microsoft.com/BizTalk/2003/file-properties": "FILE",
    "http://schemas.microsoft.com/BizTalk/2003/messagetracking-properties": "MessageTracking",
    "http://schemas.microsoft.com/BizTalk/2003/messageagent-properties": "MessageAgent",
    "http://schemas.microsoft.com/BizTalk/2003/xmlnorm-properties": "XMLNORM",
    "http://schemas.microsoft.com/BizTalk/2003/xlangs-runtime-properties": "XLANGs",
    ERROR_NS: "ErrorReport",
}
RESUMABLE, NOT_RESUMABLE = 4, 32


def short_name(namespace: str, overrides: dict[str, str]) -> str:
    """`<short>.<property>` header prefix: configured, well known, or the namespace's last segment."""
    if namespace in overrides:
        return overrides[namespace]
    if namespace in SHORT_NAMES:
        return SHORT_NAMES[namespace]
    tail = namespace.rstrip("/#").replace("#", "/").rsplit("/", 1)[-1]
    return tail or namespace or "Context"


def header_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        try:
            return orjson.dumps(value).decode()
        except TypeError:  # a BSTR holding a lone surrogate: kept, for the target's refusal to name the header
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "" if value is None else str(value)



def _walked(ids: list[Any], dialect: str) -> list[Any]:
    """The id columns as a key walk selects them (biztalk_fetch.uuid_text)."""
    return [biztalk_fetch.uuid_text(c, dialect) for c in ids]

class BizTalkSource(ScanSource):
    system: ClassVar[str] = "biztalk"
    time_columns: ClassVar[frozenset[str]] = frozenset({"dtTimeStamp", "dtExpiration", "dtSuspendTimeStamp"})
    identity_fields: ClassVar[frozenset[str]] = frozenset({"uidMessageID", "uidInstanceID", "kind", "spool_id"})

    def __init__(self, job: JobConfig, engine: sa.Engine, queue: str, database: str) -> None:
        super().__init__(job, engine, queue, database)
        self.t = tables(job.source.schema_, [queue])
        self.work, self.suspended = self.t[f"{queue}Q"], self.t[f"{queue}Q_Suspended"]
        # MessageBox times are written by the engine in UTC unless the job says otherwise [INFERRED].
        self.tz = zone(job.source.timezone or "UTC")
        self.namespaces: dict[str, str] = {}
        self.header_names: dict[str, dict[str, str]] = {}  # namespace -> property -> header name
        self.header_count = 0
        self.context_memo: list[Any] = []  # the compiled reader's memory of the last bag's names (context_fields)
        self.message_type_property: uuid.UUID | None = None
        self.mapping: Any = None

    def configure(self, mapping: Any) -> None:
        self.mapping = mapping
        self.namespaces = dict(mapping.biztalk.namespaces)
        self.header_names = {}  # namespace -> property -> header name, as `namespaces` names them
        self.header_count = 0
        self.context_memo = []  # it holds header names: made anew with them
        prop = mapping.biztalk.message_type_property_id
        self.message_type_property = uuid.UUID(prop) if prop else None

    def check_schema(self, conn: sa.Connection) -> None:
        if getattr(conn.dialect, "is_mariadb", False):
            # Its uuid columns read back with their bytes in another order than they were written,
            # so no entry matched its key: a sync moved nothing and said all was well.
            raise SourceSchemaError("a BizTalk MessageBox on MariaDB is not supported: MariaDB returns its uuid "
                                    "columns with their bytes reordered, so entries cannot be matched to their keys; "
                                    "use SQL Server (BizTalk's own), PostgreSQL or SQLite")
        insp = sa.inspect(conn)
        schema = self.job.source.schema_
        needed = ["Spool", "MessageParts", "Parts", "Fragments", "InstancesSuspended", self.work.name, self.suspended.name]
        missing = [n for n in needed if not insp.has_table(n, schema=schema)]
        if missing:
            raise SourceSchemaError(f"BizTalk MessageBox tables missing for host {self.queue!r}: {', '.join(missing)}")

    # -- reading ---------------------------------------------------------------------------
    def keyset(self) -> sa.Subquery:
        """Work-queue entries, then suspended ones, by message and instance id."""
        parts = [sa.select(sa.literal(prefix).label("p"), t.c.uidMessageID.label("m"), t.c.uidInstanceID.label("i"))
                 for prefix, t in (("Q", self.work), ("S", self.suspended))]
        return sa.union_all(*parts).subquery()

    def key_of_row(self, row: Sequence[Any]) -> str:
        return f"{row[0]}:{row[1]}:{row[2]}"

    def _slices(self, after: Sequence[Any] | None, upto: Sequence[Any] | None, dialect: str) -> list[sa.Select]:
        """The work queue's part of the slice, then the suspended queue's, each paged on its own
        primary key (message, instance): a page is an index range scan, where a page of the
        union was a sort of both queues whole."""
        out = []
        for prefix, t in (("Q", self.work), ("S", self.suspended)):
            if (after is not None and prefix < after[0]) or (upto is not None and prefix > upto[0]):
                continue
            cols = [t.c.uidMessageID, t.c.uidInstanceID]
            stmt = sa.select(sa.literal(prefix).label("p"), *_walked(cols, dialect)).order_by(*cols)
            if after is not None and prefix == after[0]:
                stmt = stmt.where(tuple_after(cols, after[1:], dialect))
            if upto is not None and prefix == upto[0]:
                stmt = stmt.where(sa.not_(tuple_after(cols, upto[1:], dialect)))
            out.append(stmt)
        return out

    def iter_sent(self, conn: sa.Connection) -> Iterator[tuple[str, datetime | None]]:
        """Each entry in the keyset's order, with its message's Spool.dtTimeStamp (local time)."""
        s = self.t["Spool"]
        for prefix, q in (("Q", self.work), ("S", self.suspended)):
            ids = _walked([q.c.uidMessageID, q.c.uidInstanceID], conn.dialect.name)
            stmt = (sa.select(sa.literal(prefix), *ids, s.c.dtTimeStamp)
                    .outerjoin(s, s.c.uidMessageID == q.c.uidMessageID).order_by(q.c.uidMessageID, q.c.uidInstanceID))
            for *key, stamp in conn.execute(stmt.execution_options(stream_results=True, yield_per=10_000)):
                yield self.key_of_row(key), (None if stamp is None else local_to_utc(stamp, self.tz))

    @staticmethod
    def _split(key: str) -> tuple[str, uuid.UUID, uuid.UUID]:
        prefix, message, instance = key.split(":")
        return prefix, uuid.UUID(message), uuid.UUID(instance)

    def sort_of(self, key: str) -> tuple[str, uuid.UUID, uuid.UUID]:
        """A key is its sort tuple, spelled out: the next pass of a drain walks on after it."""
        return self._split(key)

    def sort_of_row(self, row: Sequence[Any]) -> tuple[str, uuid.UUID, uuid.UUID]:
        return self.sort_of(self.key_of_row(row))  # a walked row's ids may be their text (_walked)

    def fetch_keys(self, conn: sa.Connection, keys: Sequence[str], lock: bool) -> list[SourceRow]:
        """The entries with these keys, with their Spool row and parts, in the order given; a few
        queries per batch (by message id, the leading column of each queue's primary key)."""
        wanted = biztalk_fetch.wanted_keys(keys)
        found: dict[str, dict[str, Any]] = {}
        dialect = conn.dialect.name
        step = max(len(keys), 1) if dialect == "postgresql" else 500  # PostgreSQL: one text the server splits
        # A batch's entries by the queues' keys, where the planner read the queue whole; their
        # context bags and parts as bytes, not hex.
        with by_index(conn), binary_rows(conn):
            for prefix, q in (("Q", self.work), ("S", self.suspended)):
                found.update(biztalk_fetch.entries(conn, self.t, q, prefix, wanted, step))
            parts = biztalk_fetch.parts(conn, self.t, sorted({str(v["uidMessageID"]) for v in found.values()}), step)
        rows = []
        for key in keys:
            hit = found.get(key)
            if hit is None:
                continue  # consumed by BizTalk since the scan
            hit["parts"] = parts.get(str(hit["uidMessageID"]), [])
            rows.append(SourceRow(key=key, consumable=True, values=hit))
        return rows

    def may_come_back(self, conn: sa.Connection, keys: Sequence[str]) -> set[str]:
        """An entry gone from `<Host>Q` may come back while its message lives: BizTalk suspends an
        instance by moving its entry to `<Host>Q_Suspended` and an operator's resume moves it back,
        with the same message and instance ids. So an entry is gone for good only once its message
        has no Spool row (the MessageBox purges it when no instance refers to it any more) and no
        entry of either queue names it."""
        s = self.t["Spool"]
        split = {k: self._split(k) for k in keys}
        messages = sorted({m for _, m, _ in split.values()})
        living: set[uuid.UUID] = set()
        for start in range(0, len(messages), 500):
            chunk = messages[start:start + 500]
            for table, col in ((s, s.c.uidMessageID), (self.work, self.work.c.uidMessageID),
                               (self.suspended, self.suspended.c.uidMessageID)):
                living.update(conn.execute(sa.select(col).where(col.in_(chunk)).distinct()).scalars())
        return {k for k, (_, m, _) in split.items() if m in living}

    # -- move mode -------------------------------------------------------------------------
    def consume(self, conn: sa.Connection, keys: Sequence[Any]) -> int:
        """Removes the work-queue (or suspended-queue) entry only; Spool and parts stay for
        BizTalk's own cleanup jobs, which purge messages no queue refers to."""
        done = 0
        split = [self._split(str(k)) for k in keys]
        for prefix, q in (("Q", self.work), ("S", self.suspended)):
            pairs = [(m, i) for p, m, i in split if p == prefix]
            for start in range(0, len(pairs), 200):  # OR of pairs: SQL Server has no row-value IN
                chunk = pairs[start:start + 200]
                done += conn.execute(sa.delete(q).where(sa.or_(
                    *(sa.and_(q.c.uidMessageID == m, q.c.uidInstanceID == i) for m, i in chunk)))).rowcount
        return done

    # -- giving consumed entries back (move-mode rollback: bridge.ledger.giveback, biztalk_giveback) --
    gives_back: ClassVar[bool] = True
    marks_give_backs: ClassVar[bool] = True

    def give_back_delivered(self, conn: sa.Connection, key: str, table: str, delivered: dict[str, Any]
                            ) -> tuple[str, dict[str, Any] | None]:
        return biztalk_giveback.rebuild(self, conn, key, delivered)

    def give_back(self, conn: sa.Connection, owed: Sequence[Any]) -> tuple[list[str], int]:
        return biztalk_giveback.give_back(self, conn, owed)

    def added_headers(self) -> frozenset[str]:
        return frozenset({"BizTalk.ServiceID", "BizTalk.AdditionalInfo"})

    def given_back_raw(self, owed: Any) -> dict[str, Any]:
        return owed.payload["raw"]

    # -- decoding --------------------------------------------------------------------------
    def decode(self, row: SourceRow) -> CanonicalMessage:
        (state, conversation, message_type, content_type, sent, expires, failure, headers, body,
         extra) = self._fields(row)
        return self.message(row, state=state, destination=self.queue, conversation_id=conversation,
                            enclosed_types=[message_type] if message_type else [], content_type=content_type,
                            time_sent=sent, expires=expires, failure=failure, headers=headers, body=body, parts=extra)

    def plain(self, row: SourceRow, message_id: str) -> PlainMessage | None:
        """The fast lane: a ready or suspended entry with one part, no expiry, and values the model
        takes as they are, as a PlainMessage; anything else (or any doubt) goes through `decode`."""
        try:
            (state, conversation, message_type, content_type, sent, expires, failure, headers, body,
             extra) = self._fields(row)
        except BadRow:
            return None
        if (state not in ("ready", "failed") or expires is not None or extra
                or (message_type is not None and type(message_type) is not str)
                or (conversation is not None and type(conversation) is not str)):
            return None  # what the model would refuse, or has to judge: the validated path says
        info = None if failure is None else FailureInfo(
            failure.exception_type, failure.message, failure.stack_trace, failure.failed_queue, failure.time_of_failure)
        return PlainMessage(state, message_id, self.system, self.database, self.queue, self.ledger_key(row), self.queue,
                            None, None, [message_type] if message_type else [], content_type, sent, None, headers, body,
                            info, None, conversation)

    def _fields(self, row: SourceRow) -> tuple:
        """What `decode` and `plain` both make of an entry: state, conversation id, message type,
        content type, time sent, expiry, failure, headers, body, the other parts."""
        v = row.values
        if v["spool_id"] is None:
            raise BadRow(f"work-queue entry refers to message {v['uidMessageID']} that is not in Spool")
        try:
            headers, message_type, report_type, interchange = self.context(bytes(v["imgContext"] or b""))
            body_name, body, extra = self._decode_parts(v)
        except BizTalkFormatError as e:
            raise BadRow(str(e)) from None
        # A message suspended before routing carries its type in the error report only.
        message_type = message_type or report_type or v["nvcMessageType"]
        headers["BizTalk.MessageID"] = str(v["uidMessageID"])
        headers["BizTalk.InstanceID"] = str(v["uidInstanceID"])
        headers["BizTalk.BodyPartName"] = body_name
        # What a move-mode rollback needs to put the entry back (bridge.sources.biztalk_giveback).
        headers["BizTalk.ServiceID"] = str(v["uidServiceID"]) if v.get("uidServiceID") else ""
        if v["nvcAdditionalInfo"] is not None:
            headers["BizTalk.AdditionalInfo"] = v["nvcAdditionalInfo"]
        sent = local_to_utc(v["dtTimeStamp"], self.tz) if v["dtTimeStamp"] else utcnow()
        expires = local_to_utc(v["dtExpiration"], self.tz) if v["dtExpiration"] else None
        state = "ready"
        failure = None
        if v["kind"] == "S":
            state, failure = "failed", self._failure(v, headers)
        elif expires is not None and expires <= utcnow():
            state = "expired"
        return (state, interchange or None, message_type or None,
                "application/xml" if body.lstrip()[:1] == b"<" else "application/octet-stream", sent, expires, failure,
                headers, body, extra)

    plain_columns = plain_lane.decoded_columns
    # The decoded lane saves only a row's envelope and write (each row is still decoded alone):
    # below this many rows its fixed cost is more (bench/lane_threshold.py, 2026-11-28).
    lane_min_rows: ClassVar[int] = 1536

    def context(self, blob: bytes) -> ContextFields:
        """An imgContext bag's headers and picked values (codecs.biztalk.context_fields), its
        properties named as this source's mapping names their namespaces."""
        return context_fields(blob, self.header_names, self._header_name, header_text, self.context_memo)

    def _header_name(self, namespace: str, name: str) -> str:
        """A context property's header name, kept for the bags to come (`header_names`)."""
        header = f"{short_name(namespace, self.namespaces)}.{name}"
        if self.header_count < 10_000:  # a bag's names repeat; a store of made-up ones stays bounded
            self.header_names.setdefault(namespace, {})[name] = header
            self.header_count += 1
        return header

    def _decode_parts(self, v: dict[str, Any]) -> tuple[str, bytes, list[Part]]:
        parts = v["parts"]
        if not parts:
            raise BadRow(f"message {v['uidMessageID']} has no rows in MessageParts")
        if v["nNumParts"] is not None and len(parts) != v["nNumParts"]:
            raise BadRow(f"Spool.nNumParts says {v['nNumParts']} parts, MessageParts holds {len(parts)}")
        body: tuple[str, bytes] | None = None
        extra: list[Part] = []
        for part in parts:
            name = part["nvcPartName"] or str(part["uidPartID"])
            if part["part_row"] is None:
                raise BadRow(f"part {name!r} ({part['uidPartID']}) is missing from Parts")
            count = part["nNumFragments"] or 1
            frags = [bytes(part["imgPart"] or b"")] + [f for f in part["fragments"] if f is not None]
            if len(frags) != count:
                raise BadRow(f"part {name!r}: nNumFragments says {count}, found {len(frags)} (Parts.imgPart + Fragments)")
            data = decode_part(frags, part["nPartSize"])
            is_body = part["uidPartID"] == v["uidBodyPartID"] or (v["uidBodyPartID"] is None and part["nBodyPart"])
            if is_body and body is None:
                body = (name, data)
            else:
                extra.append(Part(name=name, body=data))
        if body is None:
            raise BadRow(f"message {v['uidMessageID']}: none of its parts is the body part")
        return body[0], body[1], extra

    def _failure(self, v: dict[str, Any], headers: dict[str, str]) -> Failure:
        if v.get("suspended_row") is None:
            raise BadRow(f"suspended entry {v['uidInstanceID']} has no InstancesSuspended row")
        text = v["nvcErrorDescription"] or ""
        headers["BizTalk.Resumable"] = "true" if v["nState"] == RESUMABLE else "false"
        if v["nvcAdapter"]:
            headers["BizTalk.Adapter"] = v["nvcAdapter"]
        if v["nvcURI"]:
            headers["BizTalk.URI"] = v["nvcURI"]
        when = v["dtSuspendTimeStamp"]
        return Failure(
            exception_type=headers.get("ErrorReport.FailureCode") and f"BizTalk.Suspended.{headers['ErrorReport.FailureCode']}" or "BizTalk.SuspendedInstance",
            message=text.strip().splitlines()[0] if text.strip() else "suspended by BizTalk",
            stack_trace=text,
            failed_queue=self.queue,
            time_of_failure=local_to_utc(when, self.tz) if when else utcnow(),
        )

    # -- subscriptions ---------------------------------------------------------------------
    def _subscription_rows(self, conn: sa.Connection) -> list[tuple[str, uuid.UUID, list[tuple[Any, str]], bool]]:
        """(name, AND group, [(property, value)], has other predicates) per OR branch."""
        sub, pg, eq = self.t["Subscription"], self.t["PredicateGroup"], self.t["EqualsPredicates"]
        insp = sa.inspect(conn)
        schema = self.job.source.schema_
        if not all(insp.has_table(n, schema=schema) for n in ("Subscription", "PredicateGroup", "EqualsPredicates")):
            return []
        others = [sa.Table(n, sa.MetaData(schema=schema), sa.Column("uidPredicateGroupID", sa.Uuid))
                  for n in OTHER_PREDICATES if insp.has_table(n, schema=schema)]
        out = []
        stmt = sa.select(sub.c.nvcName, pg.c.uidPredicateANDGroupID).join(pg, pg.c.uidPredicateORGroupID == sub.c.uidPredicateGroupID)
        for name, group in conn.execute(stmt):
            preds = [(p, str(val)) for p, val in conn.execute(sa.select(eq.c.uidPropID, eq.c.vtValue).where(eq.c.uidPredicateGroupID == group))]
            other = any(conn.execute(sa.select(sa.func.count()).select_from(o).where(o.c.uidPredicateGroupID == group)).scalar_one() for o in others)
            out.append((name, group, preds, other))
        return out

    def subscriptions(self, conn: sa.Connection) -> list[Subscription]:
        found = []
        for name, _, preds, other in self._subscription_rows(conn):
            if self._expressible(preds, other):
                found.append(Subscription(endpoint=name, topic=preds[0][1]))
        return found

    def unexpressible(self, conn: sa.Connection) -> list[dict[str, str]]:
        """Subscriptions SubscriptionRouting cannot carry; `verify` lists them."""
        out = []
        for name, group, preds, other in self._subscription_rows(conn):
            if not self._expressible(preds, other):
                why = ("[biztalk] message_type_property_id is not set" if self.message_type_property is None
                       else "predicates other than one equality on BTS.MessageType")
                out.append({"endpoint": name, "topic": f"predicate group {group}", "reason": why})
        return out

    def _expressible(self, preds: list[tuple[Any, str]], other: bool) -> bool:
        if other or len(preds) != 1 or self.message_type_property is None:
            return False
        prop = preds[0][0]
        return (prop if isinstance(prop, uuid.UUID) else uuid.UUID(str(prop))) == self.message_type_property

