"""/status.json when one job's books cannot be read: that job's entry says why, under `error`,
beside what the process knows of it; the other jobs are shown as ever (before: a 500 for the
whole page, and a traceback in the run's log at every request)."""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from helpers import Bridge

from bridge.pipeline.loop import JobRunner
from bridge.service.metrics import MetricsServer


@dataclass
class _Lock:
    held: bool = True

    def holder(self) -> str:
        return "this process"


@dataclass
class _Worker:
    """What the listener reads of a job worker (bridge.service.view.WorkerView)."""

    name: str
    runner: JobRunner
    failures: int = 0
    stopped_reason: str | None = None
    last_success: float | None = None
    last_error: str | None = None
    retries: dict[str, int] = field(default_factory=dict)
    allowance: float = 60.0
    lock: _Lock = field(default_factory=_Lock)


def test_a_job_whose_books_fail_says_why_and_the_others_are_shown(tmp_path: Path) -> None:
    workers = []
    for name in ("good", "broken"):
        (tmp_path / name).mkdir()
        b = Bridge(tmp_path / name, f"sqlite:///{tmp_path}/{name}/l.db", f"sqlite:///{tmp_path}/{name}/n.db")
        assert b.cli("init") == 0
        b.insert(b.ready(2))
        assert b.cli("sync", "--once") == 0
        runner = b.runner()
        runner.check_ledger()  # as a running job has, once
        workers.append(_Worker(name, runner))
    conn = sqlite3.connect(tmp_path / "broken" / "n.db")
    conn.execute("drop table qbridge_checkpoint")
    conn.commit()
    conn.close()
    server = MetricsServer("127.0.0.1:0", workers)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server.server_address[1]}/status.json", timeout=10) as r:
            good, broken = json.loads(r.read())["jobs"]  # in the workers' order
    finally:
        server.stop()
    assert good["rows_moved"] == 2 and "error" not in good
    assert broken["job"] == "broken" and "no such table: qbridge_checkpoint" in broken["error"], broken
    assert broken["state"] == "running"  # what the process knows: no failure of its own
