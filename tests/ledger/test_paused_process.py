"""A `qbridge run` SIGSTOPped in the middle of a batch while a second one takes the job over
(issue 29). Its lock connection is cut, as a lock or keepalive timeout would cut it; its batch
transaction stays open, holding the queue's checkpoint row and the range-ledger blocks it locked.
The second runner takes the job lock and waits on those; SIGCONTinued, the first commits its
batch, sees it lost the job before its next one and stands by; the second reads the checkpoint
the first left and moves on. Every message arrives once: the paused batch is fenced by the row
locks its own transaction holds, not by the job lock."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge
from tests.service.test_scheduler import Log, stop, wait_for

pytestmark = pytest.mark.postgres


def _holds_lock(b: Bridge, pid: int) -> bool:
    with b.target.connect() as conn:
        return bool(conn.execute(sa.text(
            "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid "
            "where l.locktype = 'advisory' and l.granted and a.application_name = :n"),
            {"n": f"qbridge run on {socket.gethostname()} pid {pid}"[:63]}).scalar())


def test_a_paused_runner_whose_job_was_taken_over_lands_no_batch_twice(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, schedule='every = "1s"',
               batch_size=20)
    assert b.cli("init") == 0
    b.insert(b.ready(200))
    marker = tmp_path / "paused"
    first = b.spawn("run", env={"QBRIDGE_FAULT_PAUSE": "before_target_commit:3", "QBRIDGE_FAULT_FILE": str(marker),
                                "QBRIDGE_FAULT_PAUSE_SECONDS": "3"})
    first_log = Log(first)
    second = None
    try:
        wait_for("the first runner's third batch", marker.exists, proc=first)
        os.kill(first.pid, signal.SIGSTOP)
        assert b.count("Orders") == 40
        with b.target.connect() as conn:  # its lock's session dies, as a timeout would end it
            [pid] = conn.execute(sa.text("select pid from pg_stat_activity where application_name = :n"),
                                 {"n": f"qbridge run on {socket.gethostname()} pid {first.pid}"[:63]}).scalars().all()
            conn.execute(sa.text("select pg_terminate_backend(:p)"), {"p": pid})
        second = b.spawn("run")
        second_log = Log(second)
        wait_for("the second runner to take the job", lambda: _holds_lock(b, second.pid), proc=second)
        time.sleep(2)
        assert b.count("Orders") == 40, "the second runner wrote past the paused batch's locks"
        os.kill(first.pid, signal.SIGCONT)
        wait_for("every message", lambda: b.count("Orders") == 200, proc=second, timeout=60)
        wait_for("the first to stand by", lambda: first_log.has("standing by"), proc=first, timeout=30)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            stop(first, first_log)
        if second is not None:
            stop(second, second_log)
    ids = b.message_ids("Orders")
    assert len(ids) == 200 and set(ids.values()) == {1}
    assert b.cli("verify") == 0
    b.dispose()


@pytest.mark.parametrize("then", ["resumed", "killed"])
def test_a_spark_unit_paused_mid_batch_while_its_retry_runs_lands_no_batch_twice(make, tmp_path: Path, then: str) -> None:
    """A unit's first attempt stops before its target commit (SIGSTOP); its retry, another
    process, works through the same ids meanwhile and waits on the blocks the paused batch
    locked. SIGCONTinued, the first commits and goes on, and the retry redoes its batch with a
    lookup; or Spark kills the paused attempt, and its batch rolls back. Either way, once."""
    import subprocess
    import sys

    from tests.ledger.test_ledger_ranges import RACER

    b = make(batch_size=50)
    ids = b.insert(b.ready(300))
    marker = tmp_path / "paused"

    def unit(env: dict[str, str]) -> subprocess.Popen[bytes]:
        script = RACER.format(tests=str(Path(__file__).parents[1]), config=str(b.config), start=0, lo=ids[0] - 1, hi=ids[-1])
        return subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = unit({"QBRIDGE_FAULT_PAUSE": "before_target_commit:2", "QBRIDGE_FAULT_FILE": str(marker),
                  "QBRIDGE_FAULT_PAUSE_SECONDS": "1"})
    wait_for("the first attempt's second batch", marker.exists, proc=first)
    os.kill(first.pid, signal.SIGSTOP)
    retry = unit({})
    time.sleep(3)
    assert retry.poll() is None, "the retry finished past the paused batch's locked blocks"
    os.kill(first.pid, signal.SIGCONT)
    if then == "killed":
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    else:
        assert first.wait(120) == 0, first.communicate()[1].decode()[-2000:]
    out, err = retry.communicate(timeout=120)
    assert retry.returncode == 0, err.decode()[-2000:]
    got = b.message_ids("Orders")
    assert len(got) == 300 and set(got.values()) == {1}
    assert b.ledger() == {"delivered": 300}
