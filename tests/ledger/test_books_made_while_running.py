"""`init` run beside a process that started on older books (issue 45, finding 3): the state tables
a later `init` adds (qbridge_steering, qbridge_givebacks, qbridge_inflight) are looked for again
once missing, never taken as missing for the process's life. Before the fix a `qbridge run`
started before `init` made qbridge_steering delivered 7 of 7 messages after a pause, and a
rollback killed between its two commits had its withdrawn NGinn rows read as processed (skipped:
lost) by the running process, which never looked for what was owed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.retry import with_backoff
from helpers import Bridge, kill_at

pytestmark = pytest.mark.postgres
LATER = ("qbridge_steering", "qbridge_steering_audit", "qbridge_givebacks", "qbridge_inflight")


def old_books(b: Bridge) -> None:
    """The target as an `init` of before issue 28 (give-backs), 35 (in flight), 38 (steering) left it."""
    with b.target.begin() as conn:
        for name in LATER:
            conn.execute(sa.text(f'DROP TABLE "{b.target_schema}"."{name}"'))


def running(b: Bridge):
    """The job as a long-running process has it: it has looked for the later tables and missed them."""
    runner = b.runner()
    runner.kept_recheck_seconds = 0.5
    assert runner.may_go() is None
    assert not runner.givebacks_kept() and not runner.inflight_kept()
    return runner


def count_inflight(b: Bridge) -> int:
    with b.target.connect() as conn:
        return conn.execute(sa.text(f'select count(*) from "{b.target_schema}".qbridge_inflight')).scalar_one()


def test_a_pause_after_init_holds_a_process_that_started_on_old_books(make) -> None:
    b = make(batch_size=50)
    old_books(b)
    runner = running(b)
    b.insert(b.ready(3))
    assert runner.drain("MQueue1").delivered == 3
    assert b.cli("init") == 0
    assert b.cli("pause", "--job", "job1", "--why", "cutover of Orders") == 0
    time.sleep(0.6)
    b.insert(b.ready(7, start=10))
    stats = runner.drain("MQueue1")
    assert stats.delivered == 0 and "cutover of Orders" in (stats.waiting or "")
    assert b.count("Orders") == 3
    assert b.cli("resume", "--job", "job1") == 0
    assert runner.drain("MQueue1").delivered == 7


def test_a_rollback_killed_after_init_is_given_back_by_a_process_that_started_on_old_books(make, tmp_path: Path) -> None:
    b = make(batch_size=50, mode="move")
    old_books(b)
    runner = running(b)
    b.insert(b.ready(5))
    assert runner.drain("MQueue1").delivered == 5
    assert set(b.subqueues().values()) == {"X"}
    assert b.cli("init") == 0
    kill_at(b, "rollback_after_commit:1", tmp_path, ("rollback", "--yes", "--job", "job1"))  # withdrawn, not given back
    assert b.count("Orders") == 0 and set(b.subqueues().values()) == {"X"}
    time.sleep(0.6)
    stats = with_backoff(lambda: runner.drain("MQueue1"), "drain", sleep=lambda s: None)  # as `run` retries a pass
    assert (stats.delivered, stats.skipped) == (5, 0)  # given back first, then delivered again; not read as processed
    assert b.count("Orders") == 5 and all(n == 1 for n in b.message_ids("Orders").values())
    assert b.cli("verify") == 0


UNIT = """
import sys
sys.path[:0] = {paths!r}
from helpers import Bridge
from pathlib import Path
b = Bridge(Path({tmp!r}), {url!r}, {url!r}, source_schema={schema!r}, target_schema={schema!r}, mode="move", batch_size=50)
b.runner().run_range("MQueue1", 0, 10**9)
"""


def test_a_spark_unit_in_flight_after_init_is_consumed_by_a_process_that_started_on_old_books(
        make, tmp_path: Path, pg_server: str, pg_schema: str) -> None:
    b = make(batch_size=50, mode="move")
    old_books(b)
    runner = running(b)
    b.insert(b.ready(5))
    assert runner.drain("MQueue1").delivered == 5
    assert b.cli("init") == 0
    b.insert(b.ready(10, start=20))
    # A migration's unit (move mode): its target commit is in, with its keys in flight; killed
    # before it consumed them.
    marker = tmp_path / "unit-paused"
    code = UNIT.format(paths=[str(Path(__file__).parents[1]), str(Path(__file__).parents[2])], tmp=str(tmp_path / "unit"),
                       url=pg_server, schema=pg_schema)
    (tmp_path / "unit").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", code], env={"QBRIDGE_FAULT_PAUSE": "after_target_commit",
                                                               "QBRIDGE_FAULT_FILE": str(marker), "PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)
    assert count_inflight(b) == 1 and b.count("Orders") == 15
    time.sleep(0.6)
    runner.drain("MQueue1")
    assert count_inflight(b) == 0  # consumed and cleared by the running process
    assert set(b.subqueues().values()) == {"X"}
    assert b.count("Orders") == 15 and all(n == 1 for n in b.message_ids("Orders").values())
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_qbridge_run_started_on_old_books_honours_a_pause_made_after_init(make) -> None:
    """Through the real `qbridge run`, at its own re-check interval."""
    b = make(batch_size=50, schedule='every = "1s"')
    old_books(b)
    b.insert(b.ready(3))
    proc = b.spawn("run")
    try:
        _wait(lambda: b.count("Orders") == 3, proc)
        assert b.cli("init") == 0
        assert b.cli("pause", "--job", "job1", "--why", "cutover") == 0
        time.sleep(12)  # KEPT_RECHECK_SECONDS, and a tick
        b.insert(b.ready(7, start=10))
        time.sleep(4)
        assert b.count("Orders") == 3
        assert b.cli("resume", "--job", "job1") == 0
        _wait(lambda: b.count("Orders") == 10, proc)
    finally:
        proc.terminate()
        proc.wait(30)


def _wait(done, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
