"""Review: the books' locking statements whose WHERE MariaDB serves by a full scan at small table
sizes (the class of feb6d77, tests/review/test_quarantine_fold_review.py).

Under REPEATABLE READ a scanning DELETE or SELECT ... FOR UPDATE locks every record it passes
(with the gap before it) and waits on any record another transaction inserted and has not
committed. A pass records a batch's ledger entries one row an execution (pyodbc's executemany),
in the batch's order, which for a reverse job is its NServiceBus message ids: in no order of the
ledger's key. So a scan that stops at one of the pass's entries holds the gap where its next
entry goes, the pass waits on the scan, and InnoDB kills one of the two ("Deadlock found").

Findings (each a test that fails on the code as it stands):
- bridge.lifecycle.prune._remove: `DELETE FROM qbridge_ledger WHERE origin = ? AND source_key IN
  (...) AND at < ? AND outcome <> 'quarantined'` is planned as a full scan (EXPLAIN: type ALL)
  of a small ledger. `qbridge run` prunes one job after its drain while its other jobs' workers
  run their passes into the same target database.
- bridge.lifecycle.quarantine.QuarantineDesk._entry for a message quarantined under another
  source identity than today's (discard settles it; replay refuses it): `SELECT ... FROM
  qbridge_ledger WHERE message_id = ? AND job = ? AND queue = ? FOR UPDATE` (EXPLAIN: ALL) and the
  UPDATE after it (EXPLAIN: index, a full walk of the primary key), beside the job's own pass.

Each interleaving is forced with a transaction of the test's own that runs the pass's statements
in the order `State.record` runs them.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.db import engine_for
from bridge.ledger.state import LEDGER_COLUMNS, State
from bridge.lifecycle import prune
from bridge.lifecycle.quarantine import QuarantineDesk
from bridge.model import message_id_for, queue_origin
from bridge.targets.bulk import insert_values
from bridge.timefmt import naive_utc, utcnow

SYSTEM = "nservicebus"


def _waiting(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("select count(*) from information_schema.innodb_trx "
                                    "where trx_state = 'LOCK WAIT'")).scalar_one()


def _books(url: str) -> tuple[sa.Engine, State]:
    engine = engine_for(url)
    state = State(None)
    for t in state.all_tables():
        t.create(engine, checkfirst=True)
    return engine, state


def _entry(origin: int, key: str, job: str, queue: str, outcome: str = "delivered", at: Any = None,
           database: str = "db") -> tuple[Any, ...]:
    return (origin, key, str(message_id_for(SYSTEM, database, queue, key)), job, queue, outcome,
            None if outcome != "delivered" else queue, None, at or naive_utc(utcnow()))


def _plan(engine: sa.Engine, stmt: sa.Executable) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
        return [(r["type"], r["key"]) for r in conn.execute(sa.text("EXPLAIN " + sql)).mappings()]


class _Thread(threading.Thread):
    """Runs `fn`, keeping what it raised."""

    def __init__(self, fn: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.error = fn, None

    def run(self) -> None:
        try:
            self.fn()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = str(getattr(e, "orig", e)).splitlines()[0]


def finish_beside(engine: sa.Engine, conn: sa.Connection, tx: sa.RootTransaction, other: threading.Thread,
                  rest: Any) -> str | None:
    """Once `other` (started) waits on a lock, runs `rest(conn)` and commits `tx`; returns that
    transaction's error (its first line) or None, with `other` ended."""
    deadline = time.monotonic() + 10
    while _waiting(engine) == 0 and other.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    error = None
    try:
        rest(conn)
        tx.commit()
    except sa.exc.DBAPIError as e:
        error = str(e.orig).splitlines()[0]
    finally:
        conn.close()
    other.join(timeout=60)
    assert not other.is_alive()
    return error


def quarantined_under_an_old_identity(engine: sa.Engine, state: State, job: str, queue: str, key: str) -> tuple[int, str, Any]:
    """A message of `queue` quarantined before jobs[].source.database changed from "olddb" to "db":
    its entry's origin, its message id and when it was quarantined."""
    old_origin = queue_origin(SYSTEM, "olddb", queue)
    mid = str(message_id_for(SYSTEM, "olddb", queue, key))
    at = naive_utc(utcnow() - timedelta(days=1))
    with engine.begin() as conn:
        insert_values(conn, state.ledger, LEDGER_COLUMNS,
                      [_entry(old_origin, key, job, queue, "quarantined", at, database="olddb")])
        conn.execute(sa.insert(state.quarantine).values(message_id=mid, job=job, queue=queue, source_key=key,
                                                        reason="bad body", raw="{}", at=at, grp="g"))
    return old_origin, mid, at


def _against_a_pass(engine: sa.Engine, state: State, job: str, queue: str, origin: int, keys: list[str],
                    other: _Thread) -> tuple[str | None, str | None]:
    """A pass of `job`/`queue` recording entries `keys` in that order, one row an execution as
    `State.record` does, with `other` started once the first is in and waiting on it; returns
    (the pass's error, the other's)."""
    state.ensure_checkpoint(engine, job, queue)
    bob = engine.connect()
    tx = bob.begin()
    state.lock_checkpoint(bob, job, queue)
    insert_values(bob, state.ledger, LEDGER_COLUMNS, [_entry(origin, keys[0], job, queue)])
    other.start()

    def rest(conn: sa.Connection) -> None:
        for key in keys[1:]:
            insert_values(conn, state.ledger, LEDGER_COLUMNS, [_entry(origin, key, job, queue)])

    error = finish_beside(engine, bob, tx, other, rest)
    return error, other.error


@pytest.mark.mariadb
def test_prune_beside_another_jobs_pass_deadlocks_on_mariadb(mariadb_database: str) -> None:
    engine, state = _books(mariadb_database)
    old = naive_utc(utcnow() - timedelta(days=30))
    a_origin, b_origin = queue_origin(SYSTEM, "db", "QA"), queue_origin(SYSTEM, "db", "QB")
    gone = [f"a-{i:02}" for i in range(10)]  # job A's old entries whose proxy-queue rows are gone
    with engine.begin() as conn:
        insert_values(conn, state.ledger, LEDGER_COLUMNS, [_entry(a_origin, k, "jobA", "QA", at=old) for k in gone])
        insert_values(conn, state.ledger, LEDGER_COLUMNS, [_entry(b_origin, k, "jobB", "QB") for k in ("b-2", "b-4", "b-6")])
    cutoff = naive_utc(utcnow() - timedelta(days=7))
    l = state.ledger
    plan = _plan(engine, sa.delete(l).where(l.c.origin == a_origin, l.c.source_key.in_(gone), l.c.at < cutoff,
                                            l.c.outcome != "quarantined"))
    runner = SimpleNamespace(state=state, target_engine=engine, origins={"QA": a_origin},
                             job=SimpleNamespace(name="jobA"), fenced=lambda conn: None)
    removed: list[int] = []
    pruning = _Thread(lambda: removed.append(prune._remove(runner, "QA", gone, cutoff)))  # type: ignore[arg-type]

    # Job B's pass records a batch whose message ids come as b-5, then b-1.
    errors = _against_a_pass(engine, state, "jobB", "QB", b_origin, ["b-5", "b-1"], pruning)
    assert errors == (None, None), f"job A's prune (plan {plan}) and job B's pass deadlocked"
    assert removed == [10]


@pytest.mark.mariadb
def test_a_discard_of_a_message_quarantined_under_another_identity_deadlocks_with_a_pass_on_mariadb(
        mariadb_database: str) -> None:
    engine, state = _books(mariadb_database)
    queue, job = "Q1", "job1"
    origin, key = queue_origin(SYSTEM, "db", queue), "m-0"
    _, mid, at = quarantined_under_an_old_identity(engine, state, job, queue, key)
    with engine.begin() as conn:
        insert_values(conn, state.ledger, LEDGER_COLUMNS, [_entry(origin, k, job, queue) for k in ("b-2", "b-4", "b-6")])
    l = state.ledger
    plan = _plan(engine, sa.select(l.c.outcome).where(l.c.message_id == mid, l.c.job == job, l.c.queue == queue)
                 .with_for_update())
    runner = SimpleNamespace(target_engine=engine, state=state, database="db", sources={queue: object()},
                             job=SimpleNamespace(name=job, source=SimpleNamespace(system=SYSTEM)))
    desk = QuarantineDesk(runner, "alice", "bad bodies")  # type: ignore[arg-type]
    q = {"message_id": mid, "queue": queue, "source_key": key, "reason": "bad body", "raw": {},
         "at": at.isoformat()}
    outcomes: list[Any] = []
    discarding = _Thread(lambda: outcomes.append(desk._discard_one(q)))

    # The job's pass (qbridge run) records a batch whose message ids come as b-5, then b-1,
    # while an operator discards the old message from the status page.
    errors = _against_a_pass(engine, state, job, queue, origin, ["b-5", "b-1"], discarding)
    assert errors == (None, None), f"the discard (plan {plan}) and the job's pass deadlocked"
    assert [o.action for o in outcomes] == ["discarded"]
