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
    assert broken["state"] is None  # paused or held is in the books: unknown, not "running"


def test_metrics_show_no_state_for_a_job_whose_books_fail_unless_the_run_knows_it(tmp_path: Path) -> None:
    """qbridge_job_state is 1 for the state the job is in; with its books unread, paused and held
    are unknown, so no state is shown (before: running=1, which resolved QBridgeJobPausedLong for a
    paused job); a job the run itself saw stop is shown stopped."""
    from bridge.service.metrics import BridgeCollector

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    assert b.cli("pause", "--job", "job1", "--why", "maintenance") == 0
    runner = b.runner()
    paused, stopped = _Worker("paused", runner, last_success=1.0), _Worker("stopped", runner, stopped_reason="a table gone")

    def books(w: _Worker) -> dict:
        raise RuntimeError("the job's books were last read 75 s ago")

    def states(collector: BridgeCollector) -> dict[str, list[str]]:
        family = next(f for f in collector.collect() if f.name == "qbridge_job_state")
        out: dict[str, list[str]] = {}
        for s in family.samples:
            out.setdefault(s.labels["job"], [])
            if s.value == 1.0:
                out[s.labels["job"]].append(s.labels["state"])
        return out

    from bridge.lifecycle.verify import status

    assert states(BridgeCollector([paused], lambda w: status(w.runner))) == {"paused": ["paused"]}
    assert states(BridgeCollector([paused, stopped], books)) == {"stopped": ["stopped"]}
