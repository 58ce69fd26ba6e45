"""A fresh-eyes review of the fencing of issue 35: a process that lost its lock consumes or settles
nothing a rollback under the new holder gave back or another pass left pending.

Each test runs real `qbridge` processes on the local PostgreSQL, freezes one at a fault point
(bridge/faults.py), cuts the session that holds its job lock (as a failover or a network cut
does), lets another command take the job, then lets the frozen one wake."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge
from tests.ledger.test_fencing import cut_lock

pytestmark = pytest.mark.postgres


def _wait_for(marker: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    """Waits until `marker` (QBRIDGE_FAULT_FILE) says `proc` is frozen at the point named `text`."""
    deadline = time.monotonic() + timeout
    while not (marker.exists() and text in marker.read_text()):
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {text}: {proc.communicate()[1].decode()[-3000:]}")
        assert time.monotonic() < deadline, f"{text} never reached"
        time.sleep(0.1)


def _waits_on_a_row_lock(b: Bridge) -> bool:
    with b.target.connect() as conn:
        return bool(conn.execute(sa.text("select count(*) from pg_stat_activity where wait_event_type = 'Lock' "
                                         "and datname = current_database()")).scalar())


def _rollback(b: Bridge) -> subprocess.CompletedProcess[str]:
    return subprocess.run(b.spawn_args("rollback", "--yes", "--job", "job1", "--lock-wait", "60"), capture_output=True, text=True,
                          timeout=180)


def test_a_pass_that_lost_its_lock_does_not_consume_in_flight_keys_a_rollback_gave_back(make, tmp_path: Path) -> None:
    """Finding 1. `Passes._consume_inflight` consumes the keys of a list of in-flight batches it
    read before any of them, with no lock on their rows in qbridge_inflight and no fence: the
    legacy consume is unconditional on the batch still being in flight.

    1. A move-mode migrate: each Spark task's first attempt fails after its target commit
       (QBRIDGE_FAULT_FAIL=after_target_commit), leaving its batch in qbridge_inflight; the
       retry delivers nothing new, consumes the rows and drops its own batch: 4 stale batches.
    2. The migrate's closing pass reads the 4 batches, consumes the first, and freezes
       (inflight_consumed:1). Its lock session is cut.
    3. `qbridge rollback` takes the job: consumes and drops the 4 batches, withdraws all 20
       messages and gives their legacy rows back ('X' -> 'I').
    4. The closing pass wakes and consumes batches 2..4 from its stale list: 15 rows given back
       go 'I' -> 'X' while their messages are withdrawn. Lost (only its next `_pass` is fenced)."""
    b = make(mode="move", batch_size=5)
    b.insert(b.ready(20))
    marker = tmp_path / "faults"
    wake = tmp_path / "wake"
    migrate = b.spawn("migrate", env={"QBRIDGE_FAULT_FAIL": "after_target_commit", "QBRIDGE_FAULT_FILE": str(marker),
                                      "QBRIDGE_FAULT_PAUSE": "inflight_consumed:1", "QBRIDGE_FAULT_PAUSE_SECONDS": "120",
                                      "QBRIDGE_FAULT_RESUME_FILE": str(wake)})
    _wait_for(marker, "inflight_consumed", migrate)
    cut_lock(b, "migrate", migrate.pid)
    # The rollback takes the job, then waits for the rows the frozen pass holds: the pass is woken
    # once the rollback waits on them (or is done), not after a fixed pause.
    rollback_proc = subprocess.Popen(b.spawn_args("rollback", "--yes", "--job", "job1", "--lock-wait", "60"),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while rollback_proc.poll() is None and not _waits_on_a_row_lock(b):
        assert time.monotonic() < deadline, "the rollback neither ended nor waited on the frozen pass"
        time.sleep(0.1)
    assert migrate.poll() is None, "the closing pass woke before the rollback took the job"
    wake.touch()
    out, rollback_err = rollback_proc.communicate(timeout=180)
    rollback = subprocess.CompletedProcess(rollback_proc.args, rollback_proc.returncode, out, rollback_err)
    _, err = migrate.communicate(timeout=180)
    assert rollback.returncode == 0, rollback.stderr[-2000:]
    for _ in range(2):
        assert b.cli("sync", "--once") == 0
    ids = b.message_ids("Orders")
    assert len(ids) == 20 and set(ids.values()) == {1}, (len(ids), b.subqueues(), rollback.stdout[-2000:],
                                                          err.decode()[-1500:])
    assert set(b.subqueues().values()) == {"X"}, b.subqueues()
    assert b.cli("verify") == 0


def test_a_pass_that_lost_its_lock_does_not_settle_the_pending_keys_of_the_pass_after_it(make, tmp_path: Path) -> None:
    """Finding 2. `State.settle_pending` (after a pass's legacy commit) is not fenced, and takes
    keys off the checkpoint's pending list by value, whoever put them there.

    1. `sync --once` (P) delivers rows 1..10 (pending), consumes them, freezes after its legacy
       commit (after_source_commit), before it settles. Its lock session is cut.
    2. `qbridge rollback` takes the job, withdraws the 10 messages, gives their rows back ('I').
    3. `sync --once` (Q) delivers rows 1..10 again: pending [1..10], target committed; it is
       frozen before its legacy consume (after_target_commit).
    4. P wakes: its settle (slow path, the version moved) drops 1..10, Q's pending keys.
    5. Q dies before its legacy commit (SIGKILL; a crash, an OOM kill). Its rows stay 'I'
       with nothing pending: no later pass consumes them (the checkpoint is past them), so they
       are in NServiceBus and still waiting for NGinn's own receiver: delivered twice."""
    b = make(mode="move", batch_size=10)
    b.insert(b.ready(20))
    p_marker, q_marker = tmp_path / "p", tmp_path / "q"
    wake = tmp_path / "wake"
    p = b.spawn("sync", "--once", env={"QBRIDGE_FAULT_PAUSE": "after_source_commit:1", "QBRIDGE_FAULT_FILE": str(p_marker),
                                        "QBRIDGE_FAULT_PAUSE_SECONDS": "120", "QBRIDGE_FAULT_RESUME_FILE": str(wake)})
    _wait_for(p_marker, "after_source_commit", p)
    cut_lock(b, "sync", p.pid)
    rollback = _rollback(b)
    assert rollback.returncode == 0, rollback.stderr[-2000:]
    assert [s for s in b.subqueues().values()].count("I") == 20, b.subqueues()
    q = b.spawn("sync", "--once", "--lock-wait", "60",
                env={"QBRIDGE_FAULT_PAUSE": "after_target_commit:1", "QBRIDGE_FAULT_FILE": str(q_marker)})
    _wait_for(q_marker, "after_target_commit", q)
    assert p.poll() is None, "P woke before Q delivered"
    wake.touch()
    _, p_err = p.communicate(timeout=180)  # P wakes and settles
    os.kill(q.pid, signal.SIGKILL)
    q.wait(30)
    for _ in range(2):
        assert b.cli("sync", "--once") == 0
    ids = b.message_ids("Orders")
    assert len(ids) == 20 and set(ids.values()) == {1}, (len(ids), ids.most_common(3))
    left = sorted(k for k, s in b.subqueues().items() if s != "X")
    assert left == [], (left, p.returncode, p_err.decode()[-1500:])
