"""The bridge's own tables in the target database: ledger, checkpoints, quarantine.

They live beside the transport tables so that a batch's queue rows, its ledger entries and the
moved checkpoint commit in one transaction (GUIDE guarantee 1).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.codecs.jsonsafe import ascii_text, raw_json, writable
from bridge.ledger import ledger_lookup, quarantine_rows
from bridge.ledger.failure_groups import GROUP_LENGTH, group_of
from bridge.ledger.fence import jobs_table
from bridge.ledger.gaps import Gap
from bridge.ledger.inflight import Inflight, inflight_table
from bridge.ledger.job_state import job_state_table
from bridge.ledger.lane_entries import LaneEntries
from bridge.ledger.ledger_entry import LedgerEntry
from bridge.ledger.quarantine_rows import QuarantineFilter
from bridge.ledger.ranges import Ranges, ranges_table
from bridge.ledger.steering import SteeringBook, steering_audit_table, steering_table
from bridge.ledger.totals import Totals, batch_counts, totals_table
from bridge.model import LEDGER_KEY_MAX, pending_key
from bridge.targets.bulk import insert_rows, insert_values, write_in_any_charset
from bridge.timefmt import UTC, naive_utc, utcnow

LEDGER = "qbridge_ledger"
CHECKPOINT = "qbridge_checkpoint"
QUARANTINE = "qbridge_quarantine"
AUDIT = "qbridge_quarantine_audit"
GIVEBACKS = "qbridge_givebacks"
LEDGER_COLUMNS = ("origin", "source_key", "message_id", "job", "queue", "outcome", "target", "reason", "at")


def ledger_table(schema: str | None, metadata: sa.MetaData | None = None, name: str = LEDGER) -> sa.Table:
    """The ledger; `name` differs only while `qbridge init` converts an earlier one (bridge.ledger.upgrade)."""
    # Keyed by the source queue's origin and the message's key there (see model.queue_origin):
    # entries of a batch are neighbours in the key's index, as they are in the source. The
    # message id is kept for what is looked up by it (verify --deep), not indexed.
    return sa.Table(
        name, metadata or sa.MetaData(),
        sa.Column("origin", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("source_key", sa.String(LEDGER_KEY_MAX), primary_key=True),
        sa.Column("message_id", sa.String(36), nullable=False),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("outcome", sa.String(12), nullable=False),
        sa.Column("target", sa.String(260)),
        sa.Column("reason", sa.String(500)),
        sa.Column("at", sa.DateTime(), nullable=False),
        # What pruning reads: a queue's entries by age (bridge.lifecycle.prune), without walking them all.
        sa.Index(f"ix_{name}_origin_at", "origin", "at"),
        schema=schema,
    )


def state_tables(schema: str | None, metadata: sa.MetaData | None = None) -> dict[str, sa.Table]:
    md = metadata or sa.MetaData()
    ledger = ledger_table(schema, md)
    checkpoint = sa.Table(
        CHECKPOINT, md,
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("queue", sa.String(128), primary_key=True),
        sa.Column("high", sa.BigInteger()),
        sa.Column("gaps", sa.Text()),
        sa.Column("pending", sa.Text()),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("last_run_at", sa.DateTime()),
        sa.Column("last_delivery_at", sa.DateTime()),
        sa.Column("lag_seconds", sa.Float()),
        schema=schema,
    )
    quarantine = sa.Table(
        QUARANTINE, md,
        sa.Column("message_id", sa.String(36), primary_key=True),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("source_key", sa.String(LEDGER_KEY_MAX), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        # Its failure group (bridge.ledger.failure_groups); NULL only in a row an earlier qbridge
        # made, until `init` fills it.
        sa.Column("grp", sa.String(GROUP_LENGTH)),
        sa.Index("ix_qbridge_quarantine_group", "job", "grp"),
        schema=schema,
    )
    # What operators did to quarantined messages: the row leaves the quarantine for here, never
    # for nowhere, with who did it, why, and what became of the message.
    audit = sa.Table(
        AUDIT, md,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("message_id", sa.String(36), nullable=False),
        sa.Column("source_key", sa.String(LEDGER_KEY_MAX), nullable=False),
        sa.Column("action", sa.String(20), nullable=False),  # replayed | replay-failed | discarded
        sa.Column("outcome", sa.String(12), nullable=False),  # what the ledger says afterwards
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("why", sa.Text()),
        sa.Column("reason", sa.Text(), nullable=False),  # the quarantine reason it had
        sa.Column("detail", sa.Text()),  # the new reason, or where it was delivered
        sa.Column("quarantined_at", sa.DateTime(), nullable=False),
        sa.Column("raw", sa.Text(), nullable=False),
        sa.Index("ix_qbridge_quarantine_audit_job", "job", "at"),
        schema=schema,
    )
    # Legacy rows a move-mode rollback owes back (bridge.ledger.giveback): written with the withdrawal,
    # removed once the legacy side has them again; at most one rollback batch's worth.
    givebacks = sa.Table(
        GIVEBACKS, md,
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("queue", sa.String(128), primary_key=True),
        sa.Column("source_key", sa.String(LEDGER_KEY_MAX), primary_key=True),
        sa.Column("message_id", sa.String(36), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),  # legacy commits tried
        sa.Column("at", sa.DateTime(), nullable=False),
        schema=schema,
    )
    return {"ledger": ledger, "checkpoint": checkpoint, "quarantine": quarantine, "audit": audit,
            "totals": totals_table(schema, md), "ranges": ranges_table(schema, md), "givebacks": givebacks,
            "inflight": inflight_table(schema, md), "jobs": jobs_table(schema, md),
            "steering": steering_table(schema, md), "steering_audit": steering_audit_table(schema, md),
            "job_state": job_state_table(schema, md)}


@dataclass
class Checkpoint:
    job: str
    queue: str
    high: int | None = None
    gaps: list[Gap] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    version: int = 0
    last_run_at: datetime | None = None
    last_delivery_at: datetime | None = None
    lag_seconds: float | None = None


def merge_pending(pending: Sequence[Any], keys: Sequence[Any]) -> list[Any]:
    """The checkpoint's pending keys with `keys` added: merged, never overwritten, each once.
    The list holds only keys delivered but not yet consumed (a batch's, until its source
    commit; a dead pass's, until the next pass), so it stays bounded by a few batches."""
    seen = {pending_key(k) for k in pending}
    out = list(pending)
    for k in keys:
        if pending_key(k) not in seen:
            seen.add(pending_key(k))
            out.append(k)
    return out


@dataclass(frozen=True)
class Quarantined:
    message_id: str
    source_key: str
    reason: str
    raw: dict[str, Any]


class State:
    """Operations on the state tables of one target schema."""

    def __init__(self, schema: str | None) -> None:
        t = state_tables(schema)
        self.ledger, self.checkpoint, self.quarantine, self.audit = t["ledger"], t["checkpoint"], t["quarantine"], t["audit"]
        self.totals = Totals(t["totals"])
        self.ranges = Ranges(t["ranges"])
        self.givebacks, self.jobs = t["givebacks"], t["jobs"]
        self.inflight = Inflight(t["inflight"])
        self.steering = SteeringBook(schema)
        self.job_state = t["job_state"]

    def all_tables(self) -> list[sa.Table]:
        return [self.ledger, self.checkpoint, self.quarantine, self.audit, self.totals.table, self.ranges.table,
                self.givebacks, self.inflight.table, self.jobs, self.steering.table, self.steering.audit, self.job_state]

    # -- checkpoints -----------------------------------------------------------------------
    def ensure_checkpoint(self, engine: sa.Engine, job: str, queue: str) -> None:
        """Creates the row once; two processes racing to create it both succeed."""
        c = self.checkpoint
        with engine.begin() as conn:
            if conn.execute(sa.select(c.c.version).where(c.c.job == job, c.c.queue == queue)).first():
                return
        try:
            with engine.begin() as conn:
                conn.execute(self.new_checkpoint(job, queue))
        except sa_exc.IntegrityError:
            pass

    def new_checkpoint(self, job: str, queue: str) -> sa.Insert:
        """The statement that makes a queue's checkpoint row (`qbridge check` runs it for a job of its own)."""
        return sa.insert(self.checkpoint).values(job=job, queue=queue, version=0, updated_at=naive_utc(utcnow()))

    def lock_checkpoint(self, conn: sa.Connection, job: str, queue: str) -> Checkpoint:
        """Reads the checkpoint row, locked until the caller's transaction ends."""
        row = conn.execute(_lock_statement(self.checkpoint), {"job_": job, "queue_": queue}).mappings().first()
        if row is None:
            raise RuntimeError(f"checkpoint of {job}/{queue} missing; ensure_checkpoint first")
        return self._from_row(row)

    def read_checkpoints(self, conn: sa.Connection, job: str) -> dict[str, Checkpoint]:
        c = self.checkpoint
        rows = conn.execute(sa.select(c).where(c.c.job == job)).mappings()
        return {r["queue"]: self._from_row(r) for r in rows}

    @staticmethod
    def _from_row(row: Any) -> Checkpoint:
        def aware(v: datetime | None) -> datetime | None:
            return None if v is None else v.replace(tzinfo=UTC)

        return Checkpoint(
            job=row["job"], queue=row["queue"], high=row["high"],
            gaps=[Gap.from_json(g) for g in orjson.loads(row["gaps"] or "[]")],
            pending=list(orjson.loads(row["pending"] or "[]")),
            version=row["version"], last_run_at=aware(row["last_run_at"]),
            last_delivery_at=aware(row["last_delivery_at"]), lag_seconds=row["lag_seconds"],
        )

    def save_checkpoint(self, conn: sa.Connection, cp: Checkpoint) -> None:
        now = naive_utc(utcnow())
        result = conn.execute(_save_statement(self.checkpoint), {
            "job_": cp.job, "queue_": cp.queue, "version_": cp.version,
            "high": cp.high,
            "gaps": orjson.dumps([g.to_json() for g in cp.gaps]).decode(),
            "pending": orjson.dumps(cp.pending).decode() if cp.pending else None,
            "version": cp.version + 1,
            "updated_at": now,
            "last_run_at": now,
            "last_delivery_at": None if cp.last_delivery_at is None else naive_utc(cp.last_delivery_at),
            "lag_seconds": cp.lag_seconds,
        })
        if result.rowcount != 1:
            # The row lock makes this unreachable unless the database ignored FOR UPDATE.
            raise RuntimeError(f"checkpoint of {cp.job}/{cp.queue} changed under this pass; retrying")
        cp.version += 1

    def settle_pending(self, engine: sa.Engine, job: str, queue: str, keys: Sequence[Any], version: int | None,
                       fence: Any = None) -> None:
        """Takes `keys`, consumed from the source, off the checkpoint's pending list. Only what
        was consumed leaves it: a key another pass added (a pass that then died before its own
        source commit) stays for the next pass to consume. `version`: the checkpoint's version
        when the caller saved a list holding `keys` alone (None when it held others' too);
        `fence`: the caller's (bridge.ledger.fence), checked where the list has changed since."""
        if not keys:
            return
        c = self.checkpoint
        mine = (c.c.job == job, c.c.queue == queue)
        with engine.begin() as conn:
            # Unchanged since the caller saved it, the list is exactly what the caller consumed.
            if version is not None and conn.execute(
                    sa.update(c).where(*mine, c.c.version == version).values(pending=None)).rowcount == 1:
                return
            self.drop_pending(conn, self.lock_checkpoint(conn, job, queue), keys)
            # Taken off by value: after a rollback under another's lock gave these rows back, the
            # same keys may be pending again for another pass, and are not this process's to settle.
            if fence is not None:
                fence.check(conn)

    def drop_pending(self, conn: sa.Connection, cp: Checkpoint, keys: Sequence[Any]) -> None:
        """Takes `keys` off the pending list of `cp`, locked in the caller's transaction."""
        done = {pending_key(k) for k in keys}
        left = [k for k in cp.pending if pending_key(k) not in done]
        if len(left) != len(cp.pending):
            c = self.checkpoint
            conn.execute(sa.update(c).where(c.c.job == cp.job, c.c.queue == cp.queue)
                         .values(pending=orjson.dumps(left).decode() if left else None, version=cp.version + 1))
            cp.pending, cp.version = left, cp.version + 1

    def add_pending(self, conn: sa.Connection, job: str, queue: str, keys: Sequence[Any]) -> tuple[list[Any], int]:
        """Adds source keys for the next pass to consume should this process die before it does
        (quarantine replay); returns every pending key and the checkpoint's new version."""
        cp = self.lock_checkpoint(conn, job, queue)
        c = self.checkpoint
        pending = merge_pending(cp.pending, keys)
        conn.execute(sa.update(c).where(c.c.job == job, c.c.queue == queue)
                     .values(pending=orjson.dumps(pending).decode(), version=cp.version + 1))
        return pending, cp.version + 1

    # -- ledger ----------------------------------------------------------------------------
    def known(self, conn: sa.Connection, origin: int, keys: Sequence[str], ranged: bool = False) -> dict[str, str]:
        """source key -> outcome, for those of `keys` (of the queue `origin` names) already in the
        ledger; `ranged`: the queue's keys are increasing integers, kept as ranges (bridge.ledger.ranges).
        Its per-message entries are read too: an earlier qbridge's cut-off fold can leave a
        quarantined entry without its bit (tests/review/test_fold_order_review.py)."""
        if not keys:
            return {}
        out = self._entries(conn, origin, keys)
        if ranged:
            for key, outcome in self.ranges.lookup(conn, origin, map(int, keys)).items():
                out.setdefault(str(key), outcome)
        return out

    def _entries(self, conn: sa.Connection, origin: int, keys: Sequence[str]) -> dict[str, str]:
        return ledger_lookup.entries(conn, self.ledger, origin, keys)

    def record(self, conn: sa.Connection, job: str, queue: str, origin: int, entries: Sequence[LedgerEntry] | LaneEntries,
               quarantined: Sequence[Quarantined], ranged: bool = False) -> None:
        """A batch's outcomes, in the caller's transaction (a lane's as columns: LaneEntries).
        `ranged`: delivered and skipped keys become bits of the range ledger; AlreadyRecorded (as a
        duplicate entry would raise an IntegrityError) when another writer recorded one of them first."""
        now = naive_utc(utcnow())
        if entries:
            lane = entries if isinstance(entries, LaneEntries) else None
            each = entries if lane is None else lane.rest
            if ranged:  # every outcome a bit; a quarantined message also an entry, for its reason
                self.ranges.mark(conn, origin, ((int(e.source_key), e.outcome) for e in each),
                                 arrays=() if lane is None else lane.bits())
                each, lane = [e for e in each if e.outcome == "quarantined"], None  # the lane quarantines none
            def ledger_rows(text: Callable[[str], str]) -> list[tuple[Any, ...]]:
                rows = [(origin, e.source_key, str(e.message_id), job, queue, e.outcome, e.target,
                         (e.reason or None) and text(e.reason)[:500], now) for e in each]
                return rows if lane is None else lane.ledger_rows(origin, job, queue, now, text) + rows

            not_ascii = any(e.reason and not e.reason.isascii() for e in each)
            write_in_any_charset(conn, lambda text: insert_values(conn, self.ledger, LEDGER_COLUMNS, ledger_rows(text)),
                                  not_ascii or (lane is not None and lane.has_reason(lambda r: not r.isascii())))
            self.totals.add(conn, job, queue, origin,
                            entries.counts() if isinstance(entries, LaneEntries) else batch_counts(entries))
        if quarantined:
            def quarantine_rows(text: Callable[[str], str]) -> list[dict[str, Any]]:
                return [{"message_id": str(q.message_id), "job": job, "queue": queue, "source_key": q.source_key,
                         "reason": text(q.reason), "raw": raw_json(q.raw, ascii=text is ascii_text), "at": now,
                         "grp": group_of(job, queue, writable(q.reason))} for q in quarantined]

            write_in_any_charset(conn, lambda text: insert_rows(conn, self.quarantine, quarantine_rows(text)), True)

    def counts(self, conn: sa.Connection, job: str, origins: Iterable[int]) -> dict[str, dict[str, int]]:
        """queue -> outcome -> count, for the job's queues `origins` name (from the totals, not the ledger)."""
        return self.totals.counts(conn, job, origins)

    def skip_reasons(self, conn: sa.Connection, job: str, origins: Iterable[int]) -> dict[str, dict[str, int]]:
        """queue -> the mapping rule that skipped messages -> how many."""
        return self.totals.skip_reasons(conn, job, origins)

    def ledger_keys(self, conn: sa.Connection, job: str, origin: int, numeric: bool = False) -> Iterable[tuple[str, str]]:
        """(source key, outcome) of a job's queue, streamed; `numeric` orders them by the key as a number."""
        l = self.ledger
        stmt = sa.select(l.c.source_key, l.c.outcome).where(l.c.origin == origin, l.c.job == job)
        if numeric:
            stmt = stmt.order_by(sa.cast(l.c.source_key, sa.BigInteger))
        yield from conn.execute(stmt.execution_options(stream_results=True, yield_per=10_000))

    def recorded_keys(self, conn: sa.Connection, job: str, origin: int, beyond: int | None = None) -> Iterator[tuple[int, str]]:
        """(key, outcome) of a ranged queue (its keys above `beyond`, if given), ascending, each key
        once: its range bits (which any job reading the queue set), streamed, merged with the job's
        per-message entries, an entry's word first (a replay or discard changed it)."""
        # Fetched whole before the range pages are read: a ranged queue's entries are only its
        # quarantined messages (and what replay or discard made of them), and one result at a
        # time is all SQL Server serves on a connection without MARS.
        entries = sorted((int(k), 0, o) for k, o in self.ledger_keys(conn, job, origin) if beyond is None or int(k) > beyond)
        bits = ((k, 1, o) for k, o in self.ranges.stream(conn, origin, beyond))
        last = None
        for key, _, outcome in heapq.merge(entries, bits):
            if key != last:
                last = key
                yield key, outcome

    def quarantined(self, conn: sa.Connection, job: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """A job's quarantined rows (bridge.ledger.quarantine_rows.quarantined)."""
        return quarantine_rows.quarantined(self.quarantine, conn, job, *args, **kwargs)

    def failure_groups(self, conn: sa.Connection, job: str, where: QuarantineFilter | None = None) -> list[dict[str, Any]]:
        """A job's quarantine by failure group (bridge.ledger.quarantine_rows.failure_groups)."""
        return quarantine_rows.failure_groups(self.quarantine, conn, job, where)


# Built once a table, not once a pass: SQLAlchemy makes a statement's objects and its cache key
# anew each time one is built, ~0.2 ms a statement, and a pass makes a dozen (docs/benchmarks.md,
# issue 49 session 17). The values are bound parameters; the SQL is the same.
@lru_cache(maxsize=64)
def _lock_statement(c: sa.Table) -> sa.Select:
    return (sa.select(c).where(c.c.job == sa.bindparam("job_"), c.c.queue == sa.bindparam("queue_"))
            .with_for_update().with_hint(c, "WITH (UPDLOCK, ROWLOCK)", "mssql"))


@lru_cache(maxsize=64)
def _save_statement(c: sa.Table) -> sa.Update:
    return sa.update(c).where(c.c.job == sa.bindparam("job_"), c.c.queue == sa.bindparam("queue_"),
                              c.c.version == sa.bindparam("version_"))
