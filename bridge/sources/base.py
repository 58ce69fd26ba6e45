"""What a source is: a legacy queue read in key order, one row at a time made canonical."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, NamedTuple

import sqlalchemy as sa

from bridge.config import JobConfig
from bridge.errors import BadRow
from bridge.model import CanonicalMessage, PlainMessage, message_id_for


@dataclass(frozen=True)
class Subscription:
    """One legacy subscription, as NServiceBus's SubscriptionRouting wants it."""

    endpoint: str  # legacy subscriber queue name, routed by the mapping
    topic: str  # message type FullName


class SourceRow(NamedTuple):
    """A legacy row as read: its integer key, whether move mode may consume it, and its columns.
    (A NamedTuple, not a frozen dataclass: one is built per row, and this is cheaper.)"""

    key: Any  # int for monotonic sources, str for scan sources
    consumable: bool
    values: dict[str, Any]


class Source:
    """One legacy queue of one job. Subclasses implement the primitives below."""

    system: ClassVar[str]
    # "monotonic": an increasing integer key, read after a checkpoint with gap tracking.
    # "scan": no such key; every pass lists all keys and the ledger says which are new.
    # "queue": every row read is consumed, so each pass reads the head of the queue (move only).
    cursor: ClassVar[str] = "monotonic"
    # Raw-row columns that identify a message: an operator's edit before a replay may not change
    # them (bridge.lifecycle.quarantine.QuarantineDesk.replay_edited), nor the key the ledger has it under.
    identity_fields: ClassVar[frozenset[str]] = frozenset()
    # Move mode takes quarantined rows out of the source too (they are kept in qbridge's
    # quarantine). Only for sources where a row left behind would be read again for ever.
    consumes_quarantined: ClassVar[bool] = False
    # Set when the target cannot hold a message until its due time: delayed rows are read only
    # once due (sources with a delayed store of their own).
    due_only: bool = False
    # Columns holding times, so that a row kept in quarantine as JSON can be read again.
    time_columns: ClassVar[frozenset[str]] = frozenset()

    # Whether the columnar lane keeps the bodies it parsed, for rules that change or read them
    # (Mapping.rewrites_bodies; set with the mapping by the runner).
    keep_bodies: bool = False
    # Below this many new rows a batch takes the per-row lanes: the columnar lane's fixed cost a
    # batch (its Arrow calls, the target's templates, a write a table) is more than it saves on
    # so few rows. Measured for each source by bench/lane_threshold.py.
    lane_min_rows: ClassVar[int] = 64

    def __init__(self, job: JobConfig, engine: sa.Engine, queue: str, database: str) -> None:
        self.job = job
        self.engine = engine
        self.queue = queue
        self.database = database

    def ledger_key(self, row: SourceRow) -> str:
        """The row's identity in the ledger and in its message id (its key, by default)."""
        return str(row.key)

    def configure(self, mapping: Any) -> None:
        """Takes what it needs from the job's mapping (nothing by default)."""

    def check_schema(self, conn: sa.Connection) -> None:
        """Raises SourceSchemaError when the legacy tables are not what this source reads."""
        raise NotImplementedError

    def fetch_after(self, conn: sa.Connection, after: int | None, limit: int, lock: bool,
                    upto: int | None = None) -> Sequence[SourceRow]:
        """Rows with after < key <= upto, ascending, at most `limit`; `lock` takes them skip-locked
        (a list, or a Fetched: bridge.sources.fetched)."""
        raise NotImplementedError

    def fetch_ranges(self, conn: sa.Connection, ranges: Sequence[tuple[int, int]], lock: bool) -> Sequence[SourceRow]:
        """Rows whose key lies in one of the inclusive ranges (re-checking id gaps)."""
        raise NotImplementedError

    def keys_in(self, conn: sa.Connection, ranges: Sequence[tuple[int, int]]) -> set[int]:
        """Keys of committed rows in the ranges, locked by someone or not: the last look at id
        gaps about to be given up (a row a legacy receiver holds is there, not missing)."""
        raise NotImplementedError

    def scan_keys(self, conn: sa.Connection) -> list[Any]:
        """Scan sources: the key of every row there is now, oldest first."""
        raise NotImplementedError

    def fetch_keys(self, conn: sa.Connection, keys: Sequence[Any], lock: bool) -> list[SourceRow]:
        """Scan sources: the rows with these keys, in the order given."""
        raise NotImplementedError

    def iter_keys(self, conn: sa.Connection) -> Iterator[Any]:
        """Scan sources: every key in the keyset's order, streamed (ScanSource)."""
        raise NotImplementedError

    def iter_aged(self, conn: sa.Connection, after: Sequence[Any] | None = None, page: int = 10_000
                  ) -> Iterator[tuple[Any, Any]]:
        """Scan sources: every key with its age, in the keyset's order, after the sort tuple
        `after` when one is given, `page` rows a fetch (ScanSource)."""
        raise NotImplementedError

    def aged_after(self, conn: sa.Connection, after: Sequence[Any] | None, limit: int) -> list[tuple[Any, tuple[Any, ...]]]:
        """Scan sources whose walk goes in no age order (`walks_oldest_first` false): at most
        `limit` keys oldest first after the sort tuple `after`, each with its own sort tuple."""
        raise NotImplementedError

    def age_sort(self, age: Any, key: Any) -> tuple[Any, ...]:
        """The sort tuple of `aged_after` of `key`, whose walk gave it `age`."""
        raise NotImplementedError

    def sort_of(self, key: Any) -> tuple[Any, ...] | None:
        """Scan sources: the sort tuple of `key` in the keyset, where the next walk of a drain
        may start (ScanSource); None: every walk starts at the beginning."""
        return None

    # Scan sources: whether the keyset's order is oldest first (ScanSource).
    walks_oldest_first: ClassVar[bool]

    def slice_page(self, conn: sa.Connection, after: Sequence[Any] | None, upto: Sequence[Any] | None, limit: int
                   ) -> tuple[list[Any], tuple[Any, ...] | None]:
        """Scan sources: at most `limit` keys of a slice, and the last one's sort tuple (ScanSource)."""
        raise NotImplementedError

    def slice_boundaries(self, conn: sa.Connection, every: int) -> list[tuple[Any, ...]]:
        """Scan sources: the sort tuple of every `every`-th row, where Spark cuts slices (ScanSource)."""
        raise NotImplementedError

    def queued_keys(self, conn: sa.Connection) -> Iterator[str]:
        """Queue sources (cursor "queue"): the ledger key of every row in the queue now, unlocked."""
        raise NotImplementedError

    def may_come_back(self, conn: sa.Connection, keys: Sequence[str]) -> set[str]:
        """Scan sources: the ledger keys among `keys` whose row is there, or gone but able to come
        back (their ledger entries must stay: bridge.lifecycle.prune). By default a row gone is gone for
        good: an OpenJMS handle is deleted only when acknowledged, and OpenJMS never inserts it
        again (only a move-mode give-back does, after the withdrawal removed the entry)."""
        return {self.ledger_key(row) for row in self.fetch_keys(conn, keys, False)}

    def decode(self, row: SourceRow) -> CanonicalMessage:
        """The canonical message of `row`; raises BadRow with the reason when it cannot be read."""
        raise NotImplementedError

    def plain(self, row: SourceRow, message_id: str) -> PlainMessage | None:
        """The fast lane: `row` as a PlainMessage when it is the common case and every check
        `decode` plus the model would make passes; None sends it through `decode` (the default)."""
        return None

    def plain_columns(self, rows: Sequence[SourceRow], take: Sequence[int], mids: Sequence[str]) -> Any:
        """The columnar lane (bridge.sources.columns): the rows at `take` that are provably the
        common case, as a PlainColumns; the others stay for `plain` and `decode`. None: no lane here
        (the default), or nothing in this batch for it."""
        return None

    def message(self, row: SourceRow, **fields: Any) -> CanonicalMessage:
        """The canonical message of `row`, its id and coordinates filled in; a field that does not
        validate makes the row a BadRow, never a crash."""
        key = self.ledger_key(row)
        # A dict, not a SourceRef: pydantic validates it with the rest, so one error names every bad field.
        source: Any = {"system": self.system, "database": self.database, "queue": self.queue, "key": key}
        try:
            return CanonicalMessage(
                message_id=message_id_for(self.system, self.database, self.queue, key),
                source=source,
                **fields,
            )
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise BadRow(f"cannot build a message: {e}") from None

    def consume(self, conn: sa.Connection, keys: Sequence[int]) -> int:
        """Move mode: marks rows consumed the way the legacy receiver does. Idempotent."""
        raise NotImplementedError

    # Move-mode rollback: whether consumed rows can be given back to the legacy receiver
    # (give_back_payload, give_back, given_back_raw); rollback refuses a move-mode job without.
    gives_back: ClassVar[bool] = False

    def give_back_payload(self, row: SourceRow, table: str, lands_in: Any) -> tuple[str, dict[str, Any] | None]:
        """Whether move mode consumed `row` (read as it is now, consumed) and what giving it back
        needs: ("owed", JSON-safe payload); ("theirs", None) when the legacy receiver had
        processed it before the job read it; ("unsure", None) when it cannot be told. `table`:
        where its message is (lower-case); `lands_in(row)`: where this job's mapping sends a row."""
        raise NotImplementedError

    def give_back(self, conn: sa.Connection, owed: Sequence[Any]) -> tuple[list[str], int]:
        """Gives the owed rows (bridge.ledger.giveback.Owed) back, in the caller's legacy transaction,
        touching only rows still as move mode left them (so a second call after a crash changes
        nothing); returns the keys whose row is gone, and how many rows it gave back."""
        raise NotImplementedError

    # Set where the legacy receiver deletes what it consumes (OpenJMS, BizTalk): a give-back
    # re-inserts the row from the message the job delivered (give_back_delivered), and a mark in
    # the legacy database tells a later attempt that an earlier one committed (bridge.ledger.giveback_marks).
    marks_give_backs: ClassVar[bool] = False

    def give_back_delivered(self, conn: sa.Connection, key: str, table: str, delivered: dict[str, Any]
                            ) -> tuple[str, dict[str, Any] | None]:
        """For a `marks_give_backs` source, whose consumed row is gone: ("owed", JSON-safe payload)
        to re-insert it as its legacy receiver expects it, or ("unsure", None) when the delivered
        row, or what is left of the message in the legacy database (`conn`), does not hold what
        that needs. `delivered`: the target row, as "headers" (dict), "body" (bytes), "sent" and
        "expires" (aware datetimes or None) and "reply_to" (legacy queue or None)."""
        raise NotImplementedError

    def added_headers(self) -> frozenset[str]:
        """Headers this source began to write after messages were delivered without them (what a
        move-mode rollback rebuilds rows from): `verify --deep` leaves them out of its hash."""
        return frozenset()

    def given_back_raw(self, owed: Any) -> dict[str, Any]:
        """The raw row, as before move mode consumed it, of an owed row that is gone (quarantined)."""
        raise NotImplementedError

    def oldest_after(self, conn: sa.Connection, after: int | None) -> datetime | None:
        """When the oldest row beyond the checkpoint was sent (UTC), read cheaply (the lag's start):
        the first row after it (cursor "id"), the queue's head (cursor "queue"); None if it cannot tell."""
        return None

    def count_after(self, conn: sa.Connection, after: int | None) -> int:
        """How many rows lie beyond the checkpoint (the backlog)."""
        raise NotImplementedError

    def keys_upto(self, conn: sa.Connection, high: int) -> Iterator[int]:
        """Every key <= high, ascending, streamed (for verify)."""
        raise NotImplementedError

    def max_key(self, conn: sa.Connection) -> int | None:
        raise NotImplementedError

    def keys_after(self, conn: sa.Connection, after: int | None) -> Iterator[int]:
        """Every key > after, ascending, streamed."""
        raise NotImplementedError

    def key_boundaries(self, conn: sa.Connection, after: int | None, every: int) -> list[int]:
        """Every `every`-th key > after, ascending: where the Spark engine cuts its units."""
        return [k for i, k in enumerate(self.keys_after(conn, after), 1) if i % every == 0]

    def subscriptions(self, conn: sa.Connection) -> list[Subscription]:
        """Live legacy subscriptions whose subscriber is this queue (none by default)."""
        return []

    def raw(self, row: SourceRow) -> dict[str, Any]:
        """The row as JSON-safe values, kept with a quarantined message so nothing is lost."""
        from bridge.codecs.jsonsafe import json_safe

        return {str(k): json_safe(v) for k, v in row.values.items()}

    def from_raw(self, raw: dict[str, Any], ledger_key: str) -> SourceRow:
        """The row a quarantined message was read from, rebuilt from what `raw` kept (replay)."""
        from bridge.codecs.jsonsafe import restore

        return SourceRow(key=ledger_key, consumable=True,
                         values={k: restore(v, k in self.time_columns) for k, v in raw.items()})


def dict_rows(result: sa.CursorResult) -> list[dict[str, Any]]:
    """A result's rows as dicts of column name to value, taken at once: iterating a result (or
    its mappings) fetches and copies row by row, and a batch's fetch runs per batch."""
    names = [str(k) for k in result.keys()]  # noqa: SIM118 - a Result, not a dict: keys() are its column names
    return [dict(zip(names, row)) for row in result.fetchall()]


def delivered_headers(headers: dict[str, str], mapping: Any, prefix: str = "") -> dict[str, str]:
    """The headers of a delivered row that a source wrote under `prefix`, by the names it gave
    them (a mapping's rename undone), without the prefix: what a move-mode give-back rebuilds from."""
    renamed = {new: old for old, new in mapping.headers.rename.items()} if mapping is not None else {}
    out = {}
    for name, value in headers.items():
        name = renamed.get(name, name)
        if name.startswith(prefix):
            out[name[len(prefix):]] = value
    return out


def tuple_after(columns: Sequence[sa.ColumnElement], values: Sequence[Any], dialect: str = "mssql") -> sa.ColumnElement[bool]:
    """`(c1, c2, ...) > (v1, v2, ...)`: a row-value comparison, which PostgreSQL and SQLite answer
    from an index on those columns; spelled out for SQL Server, which has none, and for MariaDB,
    which answers the row form by its first index column alone and reads the rest of it (a
    keyset page at 20,000 handles read 9,700 rows spelled as a row, 100 spelled out)."""
    if dialect not in ("mssql", "mysql", "mariadb"):
        return sa.tuple_(*columns) > sa.tuple_(*(sa.literal(v, type_=c.type) for c, v in zip(columns, values)))
    return sa.or_(*(sa.and_(*(c == v for c, v in zip(columns[:i], values[:i])), columns[i] > values[i])
                    for i in range(len(columns))))


class ScanSource(Source):
    """A source whose rows have no increasing key: each pass lists every key and the ledger
    says which are new, so a late commit is simply seen on a later pass.

    Its keys have a sort order (`keyset()`: a subquery whose columns, in order, sort the rows):
    passes walk them streamed, and the Spark engine cuts them into slices between sort tuples,
    so neither a pass nor the driver ever holds all the keys of a large store."""

    cursor: ClassVar[str] = "scan"

    def keyset(self) -> sa.Subquery:
        """The rows' sort columns, in order, and nothing else (for the queue this source reads)."""
        raise NotImplementedError

    def key_of_row(self, row: Sequence[Any]) -> Any:
        """The key of a row of `keyset()`."""
        raise NotImplementedError

    def scan_keys(self, conn: sa.Connection) -> list[Any]:
        return list(self.iter_keys(conn))

    def iter_keys(self, conn: sa.Connection) -> Iterator[Any]:
        """Every key in the keyset's order, streamed (bounded memory for verify, backlog and
        planning). Ledger keys sort as the keyset does, so chunks of them are looked up in the
        ledger's own order: at 2M handles, a walk in delivery order made every lookup a seek."""
        return self.iter_slice(conn, None, None)

    def iter_sent(self, conn: sa.Connection) -> Iterator[tuple[Any, datetime | None]]:
        """Every key in the keyset's order with when its message was sent (UTC; None where the
        source cannot say): the walk that counts the backlog finds the lag's start with it."""
        return ((key, None) for key in self.iter_keys(conn))

    def iter_aged(self, conn: sa.Connection, after: Sequence[Any] | None = None, page: int = 10_000
                  ) -> Iterator[tuple[Any, Any]]:
        """Every key with its age (what sorts it oldest first), in the keyset's order, after the
        sort tuple `after` when one is given, `page` rows a fetch: a pass takes the oldest new
        keys. By default the keyset's order is the age."""
        return ((key, n) for n, key in enumerate(self.iter_slice(conn, after, None, page)))

    #: the keyset's order is oldest first: a pass may stop at its first full batch of new keys
    walks_oldest_first: ClassVar[bool] = True

    def _slice(self, after: Sequence[Any] | None, upto: Sequence[Any] | None, dialect: str) -> sa.Select:
        cols = list(self.keyset().c)
        stmt = sa.select(*cols).order_by(*cols)
        if after is not None:
            stmt = stmt.where(tuple_after(cols, after, dialect))
        if upto is not None:
            stmt = stmt.where(sa.not_(tuple_after(cols, upto, dialect)))
        return stmt

    def _slices(self, after: Sequence[Any] | None, upto: Sequence[Any] | None, dialect: str) -> list[sa.Select]:
        """The slice as statements to run one after the other, each in key order: one, unless
        the keyset is a union that the database would sort whole for every page."""
        return [self._slice(after, upto, dialect)]

    def iter_slice(self, conn: sa.Connection, after: Sequence[Any] | None, upto: Sequence[Any] | None,
                   page: int = 10_000) -> Iterator[Any]:
        """Keys whose sort tuple is > `after` and <= `upto` (None: unbounded), in order, streamed
        `page` rows a fetch."""
        for stmt in self._slices(after, upto, conn.dialect.name):
            for row in conn.execute(stmt.execution_options(stream_results=True, yield_per=page)):
                yield self.key_of_row(row)

    def slice_page(self, conn: sa.Connection, after: Sequence[Any] | None, upto: Sequence[Any] | None, limit: int
                   ) -> tuple[list[Any], tuple[Any, ...] | None]:
        """At most `limit` keys of the slice after `after`, and the sort tuple of the last one
        (keyset paging: no cursor stays open between pages)."""
        rows: list[Any] = []
        for stmt in self._slices(after, upto, conn.dialect.name):
            rows += conn.execute(stmt.limit(limit - len(rows))).all()
            if len(rows) >= limit:
                break
        return [self.key_of_row(r) for r in rows], (self.sort_of_row(rows[-1]) if rows else None)

    def sort_of_row(self, row: Sequence[Any]) -> tuple[Any, ...]:
        """The sort tuple of a row `_slices` walked (its columns, by default)."""
        return tuple(row)

    def count_keys(self, conn: sa.Connection) -> int:
        return int(conn.execute(sa.select(sa.func.count()).select_from(self.keyset())).scalar_one())

    def slice_boundaries(self, conn: sa.Connection, every: int) -> list[tuple[Any, ...]]:
        """The sort tuple of every `every`-th row: where the Spark engine cuts its slices. The
        database numbers the rows; only the boundaries cross the wire."""
        k = self.keyset()
        cols = list(k.c)
        numbered = sa.select(*cols, sa.func.row_number().over(order_by=cols).label("qb_rn")).subquery()
        stmt = (sa.select(*(numbered.c[c.name] for c in cols)).where(numbered.c.qb_rn % every == 0)
                .order_by(*(numbered.c[c.name] for c in cols)))
        return [tuple(r) for r in conn.execute(stmt)]

    def count_after(self, conn: sa.Connection, after: int | None) -> int:
        return self.count_keys(conn)

    def keys_upto(self, conn: sa.Connection, high: int) -> Iterator[Any]:
        yield from self.iter_keys(conn)

    def max_key(self, conn: sa.Connection) -> int | None:
        return None
