"""A process that lost its job lock commits nothing that assumed it still held it (issue 35).

Each test runs real `qbridge` processes: one is frozen at a fault point, the session that holds
its job lock is cut (what a failover, an idle-session timeout or a network cut does; on SQLite,
its lock file is removed, as a cleaner of stale files would), another command takes the job and
runs, then the frozen one wakes. Afterwards every message is in NServiceBus exactly once and
`verify` balances."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge

pytestmark = pytest.mark.postgres


def _wait(marker: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before its fault point: {proc.communicate()[1].decode()[-3000:]}")
        assert time.monotonic() < deadline, "no fault point reached"
        time.sleep(0.1)


def cut_lock(b: Bridge, command: str, pid: int) -> None:
    """Ends the session that holds the job lock of `qbridge COMMAND` with process id `pid`."""
    if b.target.dialect.name == "sqlite":
        for f in Path(b.target.url.database).parent.glob("*.lock"):
            f.unlink()
        return
    name = f"qbridge {command} on {socket.gethostname()} pid {pid}"[:63]
    with b.target.connect() as conn:
        n = conn.execute(sa.text("select count(pg_terminate_backend(pid)) from pg_stat_activity where application_name = :n"),
                         {"n": name}).scalar()
    assert n == 1, f"no lock session of {name!r}"


def test_a_rollback_beside_a_migrate_whose_lock_was_cut_loses_nothing(make, tmp_path: Path) -> None:
    """The reproduction of issue 35: a move-mode migrate's task sits between its target commit and
    its legacy consume; its lock session is cut; rollback takes the job and withdraws; the task
    wakes and consumes. Before the fix: 0 of 50 in NServiceBus, all 50 'X' in NGinn."""
    b = make(mode="move")
    b.insert(b.ready(50))
    marker = tmp_path / "paused"
    migrate = b.spawn("migrate", env={"QBRIDGE_FAULT_PAUSE": "after_target_commit:1", "QBRIDGE_FAULT_FILE": str(marker),
                                      "QBRIDGE_FAULT_PAUSE_SECONDS": "6"})
    _wait(marker, migrate)
    cut_lock(b, "migrate", migrate.pid)
    rollback = subprocess.run([*b.spawn_args("rollback", "--job", "job1")], capture_output=True, text=True, timeout=120)
    _, err = migrate.communicate(timeout=120)
    for _ in range(2):
        assert b.cli("sync", "--once") == 0
    ids = b.message_ids("Orders")
    assert sum(ids.values()) == 50 and set(ids.values()) == {1}, (sum(ids.values()), b.subqueues(), rollback.stdout,
                                                                  rollback.stderr[-2000:], err.decode()[-2000:])
    assert b.cli("verify") == 0
    # The migrate's closing steps assumed it still held the job: refused, with the reason.
    assert migrate.returncode == 1 and "lost the job's lock" in err.decode(), err.decode()[-2000:]
    assert rollback.returncode == 0, rollback.stderr[-2000:]
