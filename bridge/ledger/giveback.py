"""Legacy rows that a move-mode rollback gives back (issue 28).

Move mode consumed the legacy row of every message it delivered, so withdrawing such a message
from the NServiceBus tables must give its row back to the legacy receiver, or it is lost. The
two sides are two databases, so this takes two commits, tied together by `qbridge_givebacks`:

1. The withdrawal's target transaction (bridge.lifecycle.rollback) deletes the target rows, clears the
   ledger and records, per message, what its legacy row needs (`owe`).
2. `finish`, under the queue's checkpoint lock, gives the rows back in one legacy transaction,
   commits it, then deletes what was owed in the target transaction and commits that.

Killed between the two commits of 2, the owed rows are given back again by the next `finish`:
a source's `give_back` only touches a row still exactly as move mode left it (for NGinn: 'X' and
the `last_processed` its consume stamped), so a row given back and consumed again since by the
legacy receiver is never given back twice. A row that is gone by then (NGinn's cleanup deletes
old processed rows) cannot come back: its message goes into qbridge's quarantine with the row
as it was before move mode consumed it, and `quarantine replay` delivers it. Every pass, and
rollback itself, calls `finish` before it reads the queue, so a pass never reads a row that is
still owed (it would take it as processed).

Where the legacy receiver deletes what it consumes (OpenJMS, BizTalk), a given-back row taken
again leaves nothing to look at: there the give-back also writes a mark in the legacy database
(bridge.ledger.giveback_marks), and an attempt after a kill gives back only what has none.
A row whose destination is gone by then is quarantined as above."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
import sqlalchemy as sa

from bridge import faults, tracing
from bridge.ledger import giveback_marks
from bridge.ledger.sqlite_order import sqlite_pass_order
from bridge.ledger.state import LedgerEntry, Quarantined, State, naive_utc
from bridge.timefmt import utcnow

GONE = ("its legacy row was removed while a move-mode rollback gave it back (NGinn's cleanup of processed rows; "
        "an OpenJMS destination or durable subscriber deleted; a BizTalk message purged?): kept here as the row was before move mode consumed it; `quarantine replay` delivers it")
# After an attempt whose legacy commit may have gone through, a row that is gone may have been
# given back, processed by the legacy receiver and then cleaned up: only the legacy side knows.
GONE_UNSURE = ("its legacy row was removed after a move-mode rollback that was cut off may already have given it back "
               "(then NGinn processed it before its cleanup removed it), or before (the message was never processed): "
               "check NGinn's log for it before `quarantine replay`; if NGinn processed it, `quarantine discard`")


@dataclass
class Owed:
    """One legacy row to give back: its key, its message id, and what the source needs."""

    key: str
    message_id: str
    payload: dict[str, Any]


def owe(tconn: sa.Connection, state: State, job: str, queue: str, owed: list[Owed]) -> None:
    """Records `owed` in the caller's (the withdrawal's) target transaction, each with a token of
    its own that a give-back's mark carries (bridge.ledger.giveback_marks)."""
    if owed:
        now = naive_utc(utcnow())
        tconn.execute(sa.insert(state.givebacks), [
            {"job": job, "queue": queue, "source_key": o.key, "message_id": o.message_id,
             "payload": orjson.dumps({**o.payload, "token": uuid.uuid4().hex}).decode(), "at": now} for o in owed])


def anything_owed(tconn: sa.Connection, state: State, job: str, queue: str) -> bool:
    return tconn.execute(_owed_statement(state.givebacks), {"job_": job, "queue_": queue}).first() is not None


@lru_cache(maxsize=64)
def _owed_statement(g: sa.Table) -> sa.Select:
    """Built once a table, not once a pass (bridge.ledger.state says why)."""
    return sa.select(g.c.source_key).where(g.c.job == sa.bindparam("job_"), g.c.queue == sa.bindparam("queue_")).limit(1)


def finish(runner: Any, queue: str, chunk: int = 1000) -> tuple[int, int]:
    """Gives back what a rollback of `queue` still owes; returns (rows given back, quarantined).
    `runner`: the JobRunner (its engines, state, sources). Traced as `qbridge.giveback`."""
    with tracing.span("qbridge.giveback", job=runner.job.name, queue=queue) as s:
        given, quarantined = _finish(runner, queue, chunk)
        s.set_attributes({"qbridge.given_back": given, "qbridge.quarantined": quarantined})
        return given, quarantined


def _finish(runner: Any, queue: str, chunk: int) -> tuple[int, int]:
    state, job = runner.state, runner.job.name
    if not runner.givebacks_kept():
        return 0, 0
    with runner.target_engine.connect() as tconn:
        if not anything_owed(tconn, state, job, queue):
            return 0, 0
    given = quarantined = 0
    source, g = runner.sources[queue], state.givebacks
    marks = giveback_marks.marks_table(runner.job.source.schema_) if source.marks_give_backs else None
    while _attempting(runner, queue, chunk):
        with _under_lock(runner, queue) as (sconn, stx, tconn):
            rows = tconn.execute(sa.select(g.c.source_key, g.c.message_id, g.c.payload, g.c.attempts)
                                 .where(g.c.job == job, g.c.queue == queue)
                                 .order_by(g.c.source_key).limit(chunk)).all()
            if not rows:  # another process gave them back meanwhile
                return given, quarantined
            owed = [Owed(k, mid, orjson.loads(p)) for k, mid, p, _ in rows]
            # An attempt before this one, which may have given back a row gone since (where no mark tells).
            tried = {k for k, _, _, n in rows if n > 1} if marks is None else set()
            todo = owed
            if marks is not None:  # given back by an attempt whose legacy commit went through
                done = giveback_marks.marked(sconn, marks, job, queue, [o.payload["token"] for o in owed])
                todo = [o for o in owed if o.payload["token"] not in done]
            gone_keys, back = source.give_back(sconn, todo)
            gone = set(gone_keys)
            if marks is not None:
                giveback_marks.mark(sconn, marks, job, queue, [o.payload["token"] for o in todo if o.key not in gone])
            faults.reached("giveback_before_legacy_commit")
            stx.commit()
            faults.reached("giveback_after_legacy_commit")
            lost = [o for o in owed if o.key in gone]
            if lost:
                state.record(tconn, job, queue, runner.origins[queue],
                             [LedgerEntry(o.message_id, o.key, "quarantined", None, _why(o, tried)) for o in lost],
                             [Quarantined(o.message_id, o.key, _why(o, tried), source.given_back_raw(o)) for o in lost],
                             ranged=source.cursor == "monotonic")
            keys = [o.key for o in owed]
            tconn.execute(sa.delete(g).where(g.c.job == job, g.c.queue == queue, g.c.source_key.in_(keys)))
            given += back
            quarantined += len(lost)
    forget_marks(runner, queue)
    return given, quarantined


def forget_marks(runner: Any, queue: str) -> None:
    """Deletes the queue's marks once nothing of it is owed, under its checkpoint lock (a
    withdrawal owing more takes that lock first). Run after every give-back, and by every
    rollback before it starts, which deletes what a kill just before this left."""
    if not runner.sources[queue].marks_give_backs:
        return
    marks = giveback_marks.marks_table(runner.job.source.schema_)
    with _under_lock(runner, queue) as (sconn, stx, tconn):
        if not anything_owed(tconn, runner.state, runner.job.name, queue):
            giveback_marks.forget(sconn, marks, runner.job.name, queue)
            stx.commit()


@contextmanager
def _under_lock(runner: Any, queue: str) -> Iterator[tuple[sa.Connection, sa.RootTransaction, sa.Connection]]:
    """A legacy transaction and a target one holding the queue's checkpoint lock (one writer of
    the queue's books at a time). The legacy one begins first, as a pass's does (SQLite takes a
    file's write lock at BEGIN); the caller commits it, and what it leaves open is rolled back.
    The target one commits on leaving, after the caller's legacy commit."""
    with sqlite_pass_order(runner.source_url, runner.target_url), \
            runner.source_engine.connect() as sconn, runner.target_engine.connect() as tconn:
        stx = sconn.begin()
        try:
            with tconn.begin():
                runner.state.lock_checkpoint(tconn, runner.job.name, queue)
                yield sconn, stx, tconn
                runner.fenced(tconn)
        finally:
            if stx.is_active:
                stx.rollback()


def _why(owed: Owed, tried: set[str]) -> str:
    return GONE_UNSURE if owed.key in tried else GONE


def _attempting(runner: Any, queue: str, chunk: int) -> bool:
    """Counts an attempt at the legacy commit of the next `chunk` owed rows, committed before
    it is made: a row gone on a later attempt may have been given back by this one. False when
    nothing is owed any more."""
    g, job = runner.state.givebacks, runner.job.name
    with runner.target_engine.begin() as conn:
        runner.state.lock_checkpoint(conn, job, queue)
        keys = conn.execute(sa.select(g.c.source_key).where(g.c.job == job, g.c.queue == queue)
                            .order_by(g.c.source_key).limit(chunk)).scalars().all()
        if keys:
            conn.execute(sa.update(g).where(g.c.job == job, g.c.queue == queue, g.c.source_key.in_(keys))
                         .values(attempts=g.c.attempts + 1))
            runner.fenced(conn)
    return bool(keys)


def unclaimed(engine: sa.Engine, state: State, jobs: Sequence[Any]) -> list[tuple[str, str, int]]:
    """(job, queue, rows) owed back by a rollback of a job or queue that none of `jobs` (a config's
    JobConfigs) has (renamed or removed after a rollback was killed): no pass will give them back."""
    claimed = {(j.name, q) for j in jobs for q in j.source.queues}
    g = state.givebacks
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(g.name, schema=g.schema):
            return []
        rows = conn.execute(sa.select(g.c.job, g.c.queue, sa.func.count()).group_by(g.c.job, g.c.queue)
                            .order_by(g.c.job, g.c.queue)).all()
    return [(j, q, int(n)) for j, q, n in rows if (j, q) not in claimed]


def unclaimed_advice(job: str, queue: str, rows: int) -> str:
    return (f"job {job!r} queue {queue!r}: a rollback that was cut off still owes {rows:,} legacy row(s) back, and this "
            f"config has no such job and queue (renamed or removed since?), so nothing will give them back: put job "
            f"{job!r} with queue {queue!r} back in the config as it was, run `qbridge rollback -c CONFIG --job {job} "
            f"--queue {queue}` (it gives back what is owed before anything else), then rename or remove it again")
