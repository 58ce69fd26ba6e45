"""NGinn.MessageBus: one table per queue, subqueues I/R/X/F, local times, JSON bodies.

Facts: reference/legacy-sources.md §1. The table is named like the queue (`sql://alias/Table`);
`id` is an identity column, unique within the table, and is the key qbridge walks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

import sqlalchemy as sa

from bridge.codecs import nginn as codec
from bridge.config import JobConfig
from bridge.errors import BadRow, SourceSchemaError
from bridge.identifiers import check_fits
from bridge.model import CanonicalMessage, Failure, FailureInfo, PlainMessage
from bridge.schemas.nginn import queue_table, subscription_table
from bridge.sources.base import Source, SourceRow, Subscription
from bridge.sources.fetched import Fetched, fetched
from bridge.timefmt import LocalClock, utcnow, zone

STATES = {"I": "ready", "R": "delayed", "F": "failed", "X": "processed"}
CONSUMABLE = ("I", "R", "F")
# A read's key column and how a key is made of it, its consumable-flag column and how the flag is (Fetched's).
_ROW_SHAPE = ("id", int, "subqueue", CONSUMABLE.__contains__)
PLAIN_STATES = {"I": "ready", "R": "delayed", "F": "failed", "X": "processed"}  # rows the fast lane takes (NGinnSource.plain)
_TEXT_OR_NULL = (str, type(None))
SUBSCRIPTION_TABLES = ("NGMB_Subscriptions", "NGinnMessageBus_Subscriptions")
COLUMNS = ("id", "from_endpoint", "to_endpoint", "subqueue", "insert_time", "last_processed", "retry_count", "retry_time",
           "error_info", "correlation_id", "label", "msg_text", "msg_headers", "unique_id")


class NGinnSource(Source):
    system: ClassVar[str] = "nginn"
    translated_headers: ClassVar[frozenset[str]] = codec.TRANSLATED
    time_columns: ClassVar[frozenset[str]] = frozenset({"insert_time", "retry_time", "last_processed"})
    identity_fields: ClassVar[frozenset[str]] = frozenset({"id", "unique_id"})
    lane_min_rows: ClassVar[int] = 384  # below it the lane's fixed cost is more than it saves (bench/lane_threshold.py)

    def __init__(self, job: JobConfig, engine: sa.Engine, queue: str, database: str) -> None:
        super().__init__(job, engine, queue, database)
        try:
            check_fits(queue, engine.dialect.name, "NGinn queue table")
        except ValueError as e:
            raise SourceSchemaError(str(e)) from None
        self.table = queue_table(self.queue, self.job.source.schema_)
        self.tz = zone(self.job.source.timezone or "UTC")
        self.clock = LocalClock(self.tz)

    # -- reading ---------------------------------------------------------------------------
    def check_schema(self, conn: sa.Connection) -> None:
        insp = sa.inspect(conn)
        schema = self.job.source.schema_
        if not insp.has_table(self.queue, schema=schema):
            where = f"schema {schema!r}" if schema else "the default schema"
            raise SourceSchemaError(f"NGinn queue table {self.queue!r} not found in {where} of the legacy database")
        have = {c["name"].lower() for c in insp.get_columns(self.queue, schema=schema)}
        missing = [c for c in COLUMNS if c not in have]
        if missing:
            raise SourceSchemaError(f"table {self.queue!r} is not an NGinn queue table: missing columns {', '.join(missing)}")

    def _select(self, lock: bool) -> sa.Select:
        return _select_of(self.table, lock)

    def _rows(self, result: sa.CursorResult) -> Fetched:
        return fetched(result, *_ROW_SHAPE)

    def _after(self, after: int | None, limit: int, lock: bool, upto: int | None = None) -> tuple[sa.Select, dict[str, int]]:
        """The statement of a read after `after` (up to `upto`), built once a shape (a pass and a
        Spark unit make one a batch: bridge.ledger.state says why), and its values."""
        stmt = _after_statement(self.table, lock, limit, after is not None, upto is not None)
        return stmt, {k: v for k, v in (("after_", after), ("upto_", upto)) if v is not None}

    def fetch_after(self, conn: sa.Connection, after: int | None, limit: int, lock: bool,
                    upto: int | None = None) -> Fetched:
        return self._rows(conn.execute(*self._after(after, limit, lock, upto)))

    def fetch_after_arrow(self, cursor: Any, after: int | None, limit: int) -> Fetched:
        """Copy mode's fetch_after by an ADBC PostgreSQL cursor, as Arrow columns (a read-ahead's)."""
        from bridge.sources.arrow_fetched import read_arrow  # Arrow is imported on a read-ahead's first batch

        stmt, values = self._after(after, limit, False)
        return read_arrow(cursor, stmt.params(values), *_ROW_SHAPE)

    def fetch_ranges(self, conn: sa.Connection, ranges: Sequence[tuple[int, int]], lock: bool) -> Sequence[SourceRow]:
        c = self.table.c.id
        rows: Sequence[SourceRow] = []
        for chunk in _range_chunks(ranges):
            rows = rows + self._rows(conn.execute(self._select(lock).where(sa.or_(*(c.between(lo, hi) for lo, hi in chunk)))))
        return rows

    def keys_in(self, conn: sa.Connection, ranges: Sequence[tuple[int, int]]) -> set[int]:
        c = self.table.c.id
        # No READPAST / SKIP LOCKED: on SQL Server this waits for a writer still inserting there,
        # which is the answer wanted before a gap is given up.
        return {int(k) for chunk in _range_chunks(ranges)
                for k in conn.execute(sa.select(c).where(sa.or_(*(c.between(lo, hi) for lo, hi in chunk)))).scalars()}

    def count_after(self, conn: sa.Connection, after: int | None) -> int:
        stmt = sa.select(sa.func.count()).select_from(self.table)
        if after is not None:
            stmt = stmt.where(self.table.c.id > after)
        return int(conn.execute(stmt).scalar_one())

    def oldest_after(self, conn: sa.Connection, after: int | None) -> datetime | None:
        t = self.table  # an index seek on the primary key; ids grow as NGinn inserts
        stmt = sa.select(t.c.insert_time).order_by(t.c.id).limit(1).where(sa.true() if after is None else t.c.id > after)
        first = conn.execute(stmt.with_hint(t, "WITH (READPAST)", "mssql")).scalar()
        return None if first is None else self.clock.to_utc(first)

    def max_key(self, conn: sa.Connection) -> int | None:
        value = conn.execute(sa.select(sa.func.max(self.table.c.id))).scalar_one()
        return None if value is None else int(value)

    def keys_upto(self, conn: sa.Connection, high: int) -> Iterator[int]:
        return self._stream_keys(conn, self.table.c.id <= high)

    def keys_after(self, conn: sa.Connection, after: int | None) -> Iterator[int]:
        return self._stream_keys(conn, sa.true() if after is None else self.table.c.id > after)

    def key_boundaries(self, conn: sa.Connection, after: int | None, every: int) -> list[int]:
        # The database numbers the rows itself: only the boundaries cross the wire.
        t = self.table
        numbered = sa.select(t.c.id, sa.func.row_number().over(order_by=t.c.id).label("rn"))
        if after is not None:
            numbered = numbered.where(t.c.id > after)
        sub = numbered.subquery()
        stmt = sa.select(sub.c.id).where(sub.c.rn % every == 0).order_by(sub.c.id)
        return [int(k) for k in conn.execute(stmt).scalars()]

    def _stream_keys(self, conn: sa.Connection, where: sa.ColumnElement[bool]) -> Iterator[int]:
        stmt = sa.select(self.table.c.id).where(where).order_by(self.table.c.id)
        for (key,) in conn.execute(stmt.execution_options(stream_results=True, yield_per=10_000)):
            yield int(key)

    # -- move mode -------------------------------------------------------------------------
    def consume(self, conn: sa.Connection, keys: Sequence[int]) -> int:
        """NGinn's SelectAndLockNext2: `subqueue='X', last_processed=now` for rows still pending."""
        if not keys:
            return 0
        t = self.table
        now_local = utcnow().astimezone(self.tz).replace(tzinfo=None)
        keys = list(keys)
        done = 0
        # In statements of a bounded size: a pending list can hold several batches' keys, and
        # drivers cap a statement's parameters (SQL Server 2,100, libpq 65,535).
        for start in range(0, len(keys), STATEMENT_KEYS):
            done += conn.execute(sa.update(t).where(t.c.id.in_(keys[start:start + STATEMENT_KEYS]), t.c.subqueue.in_(CONSUMABLE))
                                 .values(subqueue="X", last_processed=now_local)).rowcount
        return done

    # -- giving consumed rows back (move-mode rollback, bridge.ledger.giveback) ---------------------
    gives_back: ClassVar[bool] = True

    def give_back_payload(self, row: SourceRow, table: str, lands_in: Any) -> tuple[str, dict[str, Any] | None]:
        """The subqueue the row had is the one (of X, I, R, F) the mapping sends where its
        message is. Where two fit, R or I by its retry_time (NGinn's cleanup thread moves an R
        row to I when due), F or I/R by whether it has error_info; where X (processed by NGinn
        itself) fits with another, or none fits, it cannot be told. Its `last_processed` as
        move mode's consume stamped it tells the row, untouched since, when it is given back."""
        v = row.values
        if v["subqueue"] != "X":
            return "theirs", None  # not consumed: nothing to give back (the caller withdraws it)
        fits = [letter for letter in ("X", "I", "R", "F")
                if lands_in(row if letter == "X" else row._replace(values={**v, "subqueue": letter})) == table]
        if not fits or ("X" in fits and len(fits) > 1):
            return "unsure", None
        if fits == ["X"]:
            return "theirs", None
        if "F" in fits and len(fits) > 1:
            fits = ["F"] if v.get("error_info") else [f for f in fits if f != "F"]
        if len(fits) > 1:  # I and R
            now_local = utcnow().astimezone(self.tz).replace(tzinfo=None)
            fits = ["R" if v["retry_time"] is not None and v["retry_time"] > now_local else "I"]
        return "owed", {"subqueue": fits[0], "raw": self.raw(row)}

    def give_back(self, conn: sa.Connection, owed: Sequence[Any]) -> tuple[list[str], int]:
        from bridge.codecs.jsonsafe import json_safe

        t = self.table
        ids = [int(o.key) for o in owed]
        found: dict[int, Any] = {}
        for start in range(0, len(ids), STATEMENT_KEYS):
            # Locked, not skip-locked: a row a legacy receiver holds is waited for, never taken as gone.
            stmt = (sa.select(t.c.id, t.c.subqueue, t.c.last_processed).where(t.c.id.in_(ids[start:start + STATEMENT_KEYS]))
                    .with_for_update().with_hint(t, "WITH (UPDLOCK, ROWLOCK)", "mssql"))
            found.update((int(r.id), r) for r in conn.execute(stmt))
        gone: list[str] = []
        back: dict[str, list[int]] = {}
        for o in owed:
            row = found.get(int(o.key))
            if row is None:
                gone.append(o.key)
            elif row.subqueue == "X" and json_safe(row.last_processed) == o.payload["raw"]["last_processed"]:
                back.setdefault(o.payload["subqueue"], []).append(int(o.key))
        done = 0
        for letter, keys in back.items():
            for start in range(0, len(keys), STATEMENT_KEYS):
                done += conn.execute(sa.update(t).where(t.c.id.in_(keys[start:start + STATEMENT_KEYS]), t.c.subqueue == "X")
                                     .values(subqueue=letter)).rowcount
        return gone, done

    def given_back_raw(self, owed: Any) -> dict[str, Any]:
        return {**owed.payload["raw"], "subqueue": owed.payload["subqueue"]}

    def from_raw(self, raw: dict[str, Any], ledger_key: str) -> SourceRow:
        row = super().from_raw(raw, ledger_key)
        return SourceRow(key=int(ledger_key), consumable=row.values.get("subqueue") in CONSUMABLE, values=row.values)

    # -- decoding --------------------------------------------------------------------------
    def decode(self, row: SourceRow) -> CanonicalMessage:
        v = row.values
        letter = v["subqueue"]
        state = STATES.get(letter)
        if state is None:
            raise BadRow(f"subqueue {letter!r} is not one NGinn defines (I, R, X, F)")
        headers = codec.parse_headers(v["msg_headers"])
        legacy_type = codec.body_type(v["msg_text"]) or headers.get(codec.HDR_MSG_TYPE)
        for column in ("insert_time", "retry_time"):
            if v[column] is None:
                raise BadRow(f"{column} is NULL (the column is NOT NULL in NGinn's schema)")
        time_sent = self.clock.to_utc(v["insert_time"])
        expires = None
        if codec.HDR_TTL in headers:
            expires = self.clock.to_utc(codec.parse_local_time(headers[codec.HDR_TTL]))
            if state in ("ready", "delayed") and expires <= utcnow():
                state = "expired"  # NGinn drops such a message unprocessed
        failure = self._failure(v, Failure) if state == "failed" else None
        destination, reply_to, correlation_id, enclosed_types, content_type = self._fields(v, headers, legacy_type)
        return self.message(
            row,
            state=state,
            destination=destination,
            reply_to=reply_to,
            correlation_id=correlation_id,
            enclosed_types=enclosed_types,
            content_type=content_type,
            time_sent=time_sent,
            due=self.clock.to_utc(v["retry_time"]) if state == "delayed" else None,
            expires=expires,
            retry_count=int(v["retry_count"] or 0),
            failure=failure,
            headers=_with_columns(headers, v, row.key),
            body=v["msg_text"].encode("utf-8"),
        )

    def plain(self, row: SourceRow, message_id: str) -> PlainMessage | None:
        """A waiting ('I'), retried ('R'), failed ('F') or processed ('X') row as a PlainMessage,
        with `decode`'s own steps and every check the validated path would make; None for anything
        else (rows with a TTL, anything unreadable), which `decode` then reads."""
        v = row.values
        retry_count = v["retry_count"]
        state = PLAIN_STATES.get(v["subqueue"])
        if (state is None or v["insert_time"] is None or v["retry_time"] is None
                or type(retry_count) is not int or retry_count < 0 or type(v["msg_text"]) is not str):
            return None
        # The model takes only strings in headers and names: a driver's other type goes the validated way.
        # (Spelled out: a loop over the names costs twice as much, and this runs per row.)
        text = _TEXT_OR_NULL
        if (type(v["from_endpoint"]) not in text or type(v["to_endpoint"]) not in text
                or type(v["correlation_id"]) not in text or type(v["label"]) not in text
                or type(v["unique_id"]) not in text):
            return None
        try:
            headers = codec.parse_headers(v["msg_headers"])
            legacy_type = codec.body_type(v["msg_text"]) or headers.get(codec.HDR_MSG_TYPE)
        except BadRow:
            return None
        if codec.HDR_TTL in headers:
            return None  # it may have expired: `decode` decides
        failure = None
        if state == "failed":
            failure = self._failure(v, FailureInfo)
            if not failure.exception_type or type(failure.stack_trace) is not str:
                return None  # what `Failure` would refuse
        return self.plain_of(state, message_id, str(row.key), v, headers, legacy_type,
                             self.clock.to_utc(v["insert_time"]),
                             self.clock.to_utc(v["retry_time"]) if state == "delayed" else None,
                             v["msg_text"].encode("utf-8"), failure)

    def plain_of(self, state: Any, message_id: str, key: str, v: dict[str, Any], headers: dict[str, str],
                 legacy_type: str | None, time_sent: Any, due: Any, body: bytes, failure: Any = None) -> PlainMessage:
        """The PlainMessage of checked values: `plain` builds each row's with this, and the columnar
        lane each group's example (bridge.sources.nginn_lane), so both make the same message."""
        return PlainMessage(state, message_id, self.system, self.database, self.queue, key,
                            *self._fields(v, headers, legacy_type), time_sent, due,
                            _with_columns(headers, v, key), body, failure)

    def plain_columns(self, rows: Sequence[SourceRow], take: Sequence[int], mids: Sequence[str]) -> Any:
        from bridge.sources.nginn_lane import plain_columns

        return plain_columns(rows, take, mids, self.clock.tz.key, self.queue, self.plain_of, self.keep_bodies)

    def _failure(self, v: dict[str, Any], kind: Any) -> Any:
        """Why NGinn gave up on a failed row, as `kind` (Failure, or the lane's FailureInfo)."""
        parsed = codec.parse_exception(v["error_info"])
        return kind(
            exception_type=parsed.exception_type,
            message=parsed.message,
            stack_trace=v["error_info"] or "",
            failed_queue=self.queue,
            time_of_failure=self.clock.to_utc(v["last_processed"] or v["retry_time"]),
            inner_exception_type=parsed.inner_exception_type,
        )

    def _fields(self, v: dict[str, Any], headers: dict[str, str], legacy_type: str | None
                ) -> tuple[str, str | None, str | None, list[str], str]:
        """What `decode` and `plain` both make of a row, in PlainMessage's order: destination,
        reply queue, correlation id, enclosed types, content type. (A tuple: this runs per row.)"""
        reply = headers.get(codec.HDR_REPLY_TO)
        return (codec.endpoint_queue(v["to_endpoint"]) or self.queue,
                (codec.endpoint_queue(reply) or reply) if reply else None,
                v["correlation_id"] or None,
                [legacy_type] if legacy_type else [],
                "application/json")

    def subscriptions(self, conn: sa.Connection) -> list[Subscription]:
        return live_subscriptions(conn, self.job.source.schema_, self.tz)


def _with_columns(headers: dict[str, str], v: dict[str, Any], key: int | str) -> dict[str, str]:
    """The legacy headers, then NGinn's own columns over them (`headers` is this row's own dict)."""
    headers["NGinn.BusMessageId"] = str(key)
    headers["NGinn.FromEndpoint"] = v["from_endpoint"] or ""
    headers["NGinn.ToEndpoint"] = v["to_endpoint"] or ""
    if v["unique_id"]:
        headers["NGinn.UniqueId"] = v["unique_id"]
    if v["label"]:
        headers["NGinn.Label"] = v["label"]
    if v["retry_count"]:
        headers["NGinn.RetryCount"] = str(v["retry_count"])
    return headers


def live_subscriptions(conn: sa.Connection, schema: str | None, tz: Any) -> list[Subscription]:
    """Live rows of both NGinn subscription tables (the name changed in 2014), by subscriber queue."""
    insp = sa.inspect(conn)
    now_local = utcnow().astimezone(tz).replace(tzinfo=None)
    found: list[Subscription] = []
    for name in SUBSCRIPTION_TABLES:
        if not insp.has_table(name, schema=schema):
            continue
        t = subscription_table(name, schema)
        stmt = sa.select(t.c.subscriber_endpoint, t.c.message_type).where(
            sa.or_(t.c.expiration_date.is_(None), t.c.expiration_date >= now_local)
        )
        for endpoint, topic in conn.execute(stmt):
            queue = codec.endpoint_queue(endpoint)
            if queue and topic:
                found.append(Subscription(endpoint=queue, topic=topic))
    return sorted(set(found), key=lambda s: (s.endpoint, s.topic))


# Keys, or id ranges, per statement: under every driver's parameter cap (SQL Server's 2,100),
# and an OR of BETWEENs the planner still turns into one bitmap of index scans.
STATEMENT_KEYS = 1000
STATEMENT_RANGES = 200


def _range_chunks(ranges: Sequence[tuple[int, int]]) -> Iterator[Sequence[tuple[int, int]]]:
    return (ranges[start:start + STATEMENT_RANGES] for start in range(0, len(ranges), STATEMENT_RANGES))


def _select_of(t: sa.Table, lock: bool) -> sa.Select:
    stmt = sa.select(t).order_by(t.c.id)
    if lock:
        # NGinn's own receiver: UPDLOCK + READPAST, so its receivers and ours never block each other.
        return stmt.with_for_update(skip_locked=True).with_hint(t, "WITH (UPDLOCK, ROWLOCK, READPAST)", "mssql")
    # Copy mode reads committed rows only and steps over locked ones; they are re-checked as gaps.
    return stmt.with_hint(t, "WITH (READPAST)", "mssql")


@lru_cache(maxsize=1024)  # a few shapes a queue table (mode, batch, bounds): room for hundreds of queues
def _after_statement(t: sa.Table, lock: bool, limit: int, after: bool, upto: bool) -> sa.Select:
    stmt = _select_of(t, lock).limit(limit)
    if after:
        stmt = stmt.where(t.c.id > sa.bindparam("after_", type_=t.c.id.type))
    if upto:
        stmt = stmt.where(t.c.id <= sa.bindparam("upto_", type_=t.c.id.type))
    return stmt
