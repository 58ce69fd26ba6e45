"""Fresh-eyes review of 2699054: quarantine replay and discard fold the queue's totals after each page
(QuarantineDesk._fold, under the queue's checkpoint lock).

Findings (each a test that fails on the code as it stands):
- MariaDB (REPEATABLE READ): the fold's `DELETE ... WHERE id IN (...)` is planned as a full scan of
  qbridge_totals (EXPLAIN: type ALL), which locks every row it passes and waits on any row another
  transaction has inserted and not committed. A move-mode replay's message transaction (_deliver)
  inserts its totals rows (_settle) and only then locks the checkpoint (add_pending): beside a
  fold of the same queue (another operator, the status page's button on another group), each
  waits for the other and InnoDB kills one: the operator's replay stops with "Deadlock found".
- A queue in the job without a checkpoint row: lock_checkpoint raises RuntimeError, which the
  fold does not catch, so a discard that did its work fails (and after an error in the page,
  the RuntimeError replaces it).

Every statement runs on the real databases of the suite; the interleaving is forced by holding
a transaction open on a connection of the test's own, in the order _deliver runs them.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from bridge.db import engine_for
from bridge.ledger.state import State
from bridge.ledger.totals import RELEASED
from bridge.lifecycle.quarantine import QuarantineDesk
from helpers import MAPPING, Bridge
from tests.review.test_mariadb_scan_locks_review import finish_beside
from tests.lifecycle.test_quarantine_groups import NO_CATCH_ALL, seed

JOB, QUEUE, ORIGIN = "job1", "MQueue1", 42
MOVED = Counter({("quarantined", None): -1, (RELEASED, None): 1, ("delivered", None): 1})  # what _settle adds


def _runner(engine: sa.Engine, state: State) -> SimpleNamespace:
    """What _fold reads of a JobRunner."""
    return SimpleNamespace(target_engine=engine, state=state, job=SimpleNamespace(name=JOB), sources={QUEUE: object()})


@pytest.mark.mariadb
def test_a_fold_beside_another_move_mode_replay_of_the_queue_deadlocks_on_mariadb(
        mariadb_database: str, caplog: pytest.LogCaptureFixture) -> None:
    engine = engine_for(mariadb_database)
    state = State(None)
    for t in state.all_tables():
        t.create(engine, checkfirst=True)
    state.ensure_checkpoint(engine, JOB, QUEUE)
    with engine.begin() as conn:  # messages this desk settled on its page: rows for the fold
        for _ in range(5):
            state.totals.add(conn, JOB, QUEUE, ORIGIN, MOVED)
    desk = QuarantineDesk(_runner(engine, state), "alice", None)  # type: ignore[arg-type]
    desk._settled = {(QUEUE, ORIGIN)}

    # Bob's replay of another message of the queue, in move mode, as _deliver runs it: _settle adds
    # its totals rows, then add_pending locks the checkpoint; the transaction is open meanwhile.
    bob = engine.connect()
    bob_tx = bob.begin()
    state.totals.add(bob, JOB, QUEUE, ORIGIN, MOVED)

    caplog.set_level(logging.WARNING, logger="qbridge.quarantine")
    fold = threading.Thread(target=desk._fold)
    fold.start()
    bob_error = finish_beside(engine, bob, bob_tx, fold, lambda conn: state.add_pending(conn, JOB, QUEUE, ["7"]))
    not_folded = [r.getMessage() for r in caplog.records if "not folded" in r.getMessage()]
    assert (bob_error, not_folded) == (None, []), "the fold and a replay's message transaction deadlocked"
    with engine.connect() as conn:
        assert state.counts(conn, JOB, [ORIGIN])[QUEUE][RELEASED] == 6


@pytest.mark.postgres
def test_a_discard_of_a_queue_without_a_checkpoint_row_fails_after_its_work(make) -> None:
    b: Bridge = make(queues=["MQueue1"], mapping=NO_CATCH_ALL)
    seed(b, "MQueue1", 3, body="{not json")
    assert b.cli("sync", "--once") == 0
    assert b.ledger()["quarantined"] == 3
    with b.target.begin() as conn:  # as if the row were gone (a DBA resetting the queue)
        conn.execute(sa.text(f'delete from "{b.target_schema}".qbridge_checkpoint'))
    b.mapping = MAPPING
    runner = b.runner()
    desk = QuarantineDesk(runner, "alice", "bad bodies")
    try:
        outcomes = desk.discard(None)
        error = None
    except RuntimeError as e:
        outcomes, error = [], str(e)
    assert b.ledger()["skipped"] == 3, "the discard did its work"
    assert (error, len(outcomes)) == (None, 3), "the fold's RuntimeError failed a discard that went well"
