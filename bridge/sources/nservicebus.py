"""NServiceBus proxy queues, read the way the transport receives (the reverse direction).

A reverse job reads the queue tables NServiceBus endpoints send to when they address a legacy
endpoint (one *proxy queue* per legacy endpoint, named like it) and their `.Delayed` tables.
Facts: reference/nservicebus-target.md §1.7 and §2: oldest first by `RowVersion` / `seq`, locked
rows skipped (`UPDLOCK, READPAST` / `FOR UPDATE SKIP LOCKED`), rows deleted once handled, an
expired row discarded unprocessed.

The cursor is the queue itself ("queue"): rows are consumed after the legacy commit, so the
next pass starts at the head again. A row whose target commit happened but whose delete did not
(a crash between the two) is read again, found in the ledger, and only deleted. The ledger key
is `NServiceBus.MessageId`, so a message sent twice also arrives once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

import orjson
import sqlalchemy as sa

from bridge.config import JobConfig
from bridge.errors import BadRow, SourceSchemaError
from bridge.model import CanonicalMessage, ledger_safe_key
from bridge.schemas.nservicebus import transport_tables
from bridge.sources.base import Source, SourceRow, dict_rows
from bridge.timefmt import UTC, from_wire, utcnow

MESSAGE_ID = "NServiceBus.MessageId"
INTENTS = ("Send", "Publish", "Reply")
QUEUE, DELAYED = "q", "d"  # key prefixes: which of the two tables a row is in


def bare_queue(address: str) -> str:
    """The table name in a transport address: `Q@[schema]@[catalog]` (SQL Server) or
    `"Q"."schema"` (PostgreSQL); a bare name stays as it is."""
    if address.startswith('"'):
        end = 1
        while True:
            end = address.find('"', end)
            if end == -1:
                return address
            if address[end + 1:end + 2] == '"':
                end += 2
                continue
            return address[1:end].replace('""', '"')
    return address.split("@", 1)[0]


class NServiceBusSource(Source):
    system: ClassVar[str] = "nservicebus"
    cursor: ClassVar[str] = "queue"
    # A poison row would otherwise sit at the head of the queue for ever: it is kept, whole, in
    # qbridge's quarantine and taken off the queue, as the transport moves one to `error`.
    consumes_quarantined: ClassVar[bool] = True
    # The headers carry NServiceBus.MessageId, the ledger's key: an edit that changes it is
    # refused by the message id check of the replay itself.
    identity_fields: ClassVar[frozenset[str]] = frozenset({"table", "key"})

    def __init__(self, job: JobConfig, engine: sa.Engine, queue: str, database: str) -> None:
        super().__init__(job, engine, queue, database)
        src = job.source
        assert src.flavor is not None
        self.transport = transport_tables(src.flavor, src.schema_name, engine.url, src.catalog)
        self.queue_table = self.transport.queue(queue)
        self.delayed_table = self.transport.delayed(queue)
        col = self.transport.column
        self.seq = col(self.queue_table, "RowVersion") if src.flavor == "sqlserver" else self.queue_table.c.seq
        # The PostgreSQL delayed table has a uuid key; SQL Server's a RowVersion identity.
        self.delayed_key = col(self.delayed_table, "RowVersion") if src.flavor == "sqlserver" else self.delayed_table.c.id

    def check_schema(self, conn: sa.Connection) -> None:
        insp = sa.inspect(conn)
        for t in (self.queue_table, self.delayed_table):
            if not insp.has_table(t.name, schema=t.schema):
                raise SourceSchemaError(f"NServiceBus proxy queue table {t.name!r} not found in schema "
                                        f"{self.transport.schema!r}; run `qbridge init` (it creates the proxy queues)")

    # -- reading ---------------------------------------------------------------------------
    def _locked(self, table: sa.Table, order: sa.Column, limit: int) -> sa.Select:
        return (sa.select(table).order_by(order).limit(limit).with_for_update(skip_locked=True)
                .with_hint(table, "WITH (UPDLOCK, READPAST, ROWLOCK)", "mssql"))

    def fetch_after_seq(self, conn: sa.Connection, seq: Any, limit: int = 10) -> list[SourceRow]:
        """The receive's rows after the queue row `seq` (None: from the head): `qbridge check` reads
        its own row back, behind a queue's older messages, with the transport's statement."""
        stmt = self._locked(self.queue_table, self.seq, limit)
        if seq is not None:
            stmt = stmt.where(self.seq > seq)
        col = self.transport.column
        return [self._row(QUEUE, r[self.seq.name], r, col(self.queue_table, "Expires").name, None)
                for r in dict_rows(conn.execute(stmt))]

    def fetch_after(self, conn: sa.Connection, after: int | None, limit: int, lock: bool,
                    upto: int | None = None) -> list[SourceRow]:
        """The head of the queue, then due-ordered delayed messages, skip-locked: `limit` queue
        rows at most, and delayed ones in turn with them (up to a tenth as many again when the
        queue is full), so a busy queue never keeps a due delayed message waiting.
        (`after`/`upto` do not apply: consumed rows leave the queue.)"""
        col = self.transport.column
        rows = [self._row(QUEUE, r[self.seq.name], r, col(self.queue_table, "Expires").name, None)
                for r in dict_rows(conn.execute(self._locked(self.queue_table, self.seq, limit)))]
        # Senders keep their delayed messages in their own `.Delayed` table and move them into
        # this queue when due (reference/nservicebus-target.md §1.4): what is here was put here
        # by a writer outside NServiceBus's senders, which the transport's design allows.
        room = max(1, limit // 10) if len(rows) >= limit else limit - len(rows)
        due = col(self.delayed_table, "Due")
        stmt = self._locked(self.delayed_table, due, room)
        if self.due_only:  # the target cannot wait: leave a delayed message here until it is due
            now = utcnow()
            stmt = stmt.where(due <= (now if getattr(due.type, "timezone", False) else now.replace(tzinfo=None)))
        for r in dict_rows(conn.execute(stmt)):
            rows.append(self._row(DELAYED, r[self.delayed_key.name], r, None, due.name))
        return rows

    def _row(self, kind: str, key: Any, r: Any, expires: str | None, due: str | None) -> SourceRow:
        col = self.transport.column
        table = self.queue_table if kind == QUEUE else self.delayed_table
        text = r[col(table, "Headers").name]
        body = r[col(table, "Body").name]
        values: dict[str, Any] = {
            "table": table.name, "key": str(key), "headers": text,
            "body": None if body is None else bytes(body),
            "expires": r[expires] if expires else None, "due": r[due] if due else None,
        }
        return SourceRow(key=f"{kind}:{key}", consumable=True, values=self._parse_headers(values))

    @staticmethod
    def _parse_headers(values: dict[str, Any]) -> dict[str, Any]:
        try:
            parsed = orjson.loads(values["headers"])
            if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
                raise ValueError("not a JSON object of string values")
            values["_headers"] = parsed
        except (ValueError, TypeError) as e:
            values["_headers_error"] = str(e)
        return values

    def from_raw(self, raw: dict[str, Any], ledger_key: str) -> SourceRow:
        from bridge.codecs.jsonsafe import restore

        values = {k: restore(v, k in ("expires", "due")) for k, v in raw.items()}
        kind = QUEUE if values.get("table") == self.queue_table.name else DELAYED
        return SourceRow(key=f"{kind}:{values.get('key')}", consumable=True, values=self._parse_headers(values))

    def ledger_key(self, row: SourceRow) -> str:
        mid = row.values.get("_headers", {}).get(MESSAGE_ID)
        # A row whose headers cannot be read is kept under its place in the queue.
        return ledger_safe_key(mid) if mid else f"{row.values['table']}#{row.values['key']}"

    def queued_keys(self, conn: sa.Connection) -> Iterator[str]:
        """The ledger key of every row in the proxy queue now (for verify), unlocked."""
        col = self.transport.column
        for table, key, kind in ((self.queue_table, self.seq, QUEUE), (self.delayed_table, self.delayed_key, DELAYED)):
            headers = col(table, "Headers")
            stmt = sa.select(key, headers).with_hint(table, "WITH (READPAST)", "mssql")
            for k, text in conn.execute(stmt.execution_options(stream_results=True, yield_per=2000)):
                yield self.ledger_key(self._row(kind, k, {key.name: k, headers.name: text, col(table, "Body").name: None}, None, None))

    def fetch_ranges(self, conn: sa.Connection, ranges: Sequence[tuple[int, int]], lock: bool) -> list[SourceRow]:
        return []

    def oldest_after(self, conn: sa.Connection, after: int | None) -> datetime | None:
        """The queue's head (delayed messages are not late before they are due): its TimeSent."""
        headers = self.transport.column(self.queue_table, "Headers")
        stmt = sa.select(headers).order_by(self.seq).limit(1).with_hint(self.queue_table, "WITH (READPAST)", "mssql")
        text = conn.execute(stmt).scalar()
        try:
            return from_wire(orjson.loads(text)["NServiceBus.TimeSent"]) if text is not None else None
        except (ValueError, TypeError, KeyError):
            return None  # no readable TimeSent: the lag cannot be told

    def count_after(self, conn: sa.Connection, after: int | None) -> int:
        return sum(int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
                   for t in (self.queue_table, self.delayed_table))

    def consume(self, conn: sa.Connection, keys: Sequence[Any]) -> int:
        """Deletes handled rows, as the transport's receive does. Idempotent."""
        by_kind: dict[str, list[Any]] = {QUEUE: [], DELAYED: []}
        for k in keys:
            kind, _, value = str(k).partition(":")
            by_kind[kind].append(int(value) if kind == QUEUE or self.delayed_key.name == "RowVersion" else value)
        n = 0
        for kind, column, table in ((QUEUE, self.seq, self.queue_table), (DELAYED, self.delayed_key, self.delayed_table)):
            values = by_kind[kind]
            for start in range(0, len(values), 1000):  # under every driver's parameter cap (SQL Server's 2,100)
                n += conn.execute(sa.delete(table).where(column.in_(values[start:start + 1000]))).rowcount
        return n

    # -- decoding --------------------------------------------------------------------------
    def decode(self, row: SourceRow) -> CanonicalMessage:
        v = row.values
        if "_headers_error" in v:
            raise BadRow(f"{v['table']} row {v['key']}: the headers column is not NServiceBus's JSON: {v['_headers_error']}")
        h: dict[str, str] = v["_headers"]
        if not h.get(MESSAGE_ID):
            raise BadRow(f"{v['table']} row {v['key']}: no {MESSAGE_ID} header")
        now = utcnow()
        expires = transport_utc(v["expires"])
        state = "ready"
        due = None
        if v["due"] is not None:
            state, due = "delayed", transport_utc(v["due"])
        elif expires is not None and expires <= now:
            state = "expired"  # the transport discards such a row unprocessed
        try:
            sent = from_wire(h["NServiceBus.TimeSent"]) if "NServiceBus.TimeSent" in h else now
        except ValueError as e:
            raise BadRow(f"header NServiceBus.TimeSent: {e}") from None
        reply = h.get("NServiceBus.ReplyToAddress")
        types = [t.strip() for t in h.get("NServiceBus.EnclosedMessageTypes", "").split(";") if t.strip()]
        intent = h.get("NServiceBus.MessageIntent")
        return self.message(
            row,
            state=state,
            destination=self.queue,
            reply_to=bare_queue(reply) if reply else None,
            correlation_id=h.get("NServiceBus.CorrelationId") or None,
            conversation_id=h.get("NServiceBus.ConversationId") or None,
            enclosed_types=types,
            content_type=h.get("NServiceBus.ContentType") or None,
            intent=intent if intent in INTENTS else "Send",
            time_sent=sent,
            due=due,
            expires=expires,
            headers=h,
            body=v["body"],
        )

    def raw(self, row: SourceRow) -> dict[str, Any]:
        from bridge.codecs.jsonsafe import json_safe

        return {k: json_safe(val) for k, val in row.values.items() if not k.startswith("_")}


def transport_utc(value: datetime | None) -> datetime | None:
    """Transport times are UTC, naive in `Expires`/SQL Server `Due`, aware in PostgreSQL `Due`."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
