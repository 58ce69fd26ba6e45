"""A job stopped on an error is seen by everything an operator reads (issue 46, finding 2): its
state (running, paused, held, failing, stopped) is `qbridge_job_state{job,state}` in /metrics,
`state` in /status.json and in `status --json` from any process, and the shipped
QBridgeJobStopped fires on it, while QBridgeJobLockLost does not (the stopped job released its
lock; that is no failover). Before, a job whose target table was missing logged `stopped: ...`
and nothing but the page ever said so."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from helpers import Bridge, promtool_path
from tests.service.test_metrics import _free_port, _scrape

RULES = Path(__file__).parents[2] / "docs" / "prometheus" / "alerts.yml"


def _states(port: int) -> dict[str, float]:
    m = _scrape(f"http://127.0.0.1:{port}/metrics")
    return {s.labels["state"]: s.value for s in m["qbridge_job_state"]}


def _wait(what: str, check, proc: subprocess.Popen[bytes], seconds: float = 60):
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            got = check()
            if got:
                return got
        except (urllib.error.URLError, KeyError, ConnectionError):
            pass
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.3)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_job_stopped_on_a_missing_target_table_is_stopped_everywhere(make, capsys: pytest.CaptureFixture[str]) -> None:
    b: Bridge = make(schedule='every = "1s"', batch_size=50)
    with b.target.begin() as conn:  # the endpoint's queue, dropped by someone tidying up
        conn.execute(sa.text(f'DROP TABLE "{b.target_schema}"."Orders"'))
    b.insert(b.ready(5))
    port = _free_port()
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    try:
        states = _wait("stopped in /metrics", lambda: (s := _states(port)).get("stopped") == 1 and s, proc)
        assert sum(states.values()) == 1 and set(states) == {"running", "paused", "held", "failing", "stopped"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=10) as r:
            [job] = json.loads(r.read())["jobs"]
        assert job["state"] == "stopped" and "does not exist" in job["state_reason"], job
        capsys.readouterr()
        assert b.cli("status", "--json") == 0  # another process: the books say it
        [job] = json.loads(capsys.readouterr().out)["jobs"]
        assert job["state"] == "stopped" and "does not exist" in job["state_reason"], job
        # With every job stopped, a process with a listener stays up so that a scrape sees it
        # (it exited within a second, which no scrape interval catches: a CI run under load lost
        # the race between this test's reads and that exit).
        time.sleep(2.5)
        assert proc.poll() is None
        lock_held = _scrape(f"http://127.0.0.1:{port}/metrics")["qbridge_job_lock_held"][0].value
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err  # its job stopped on an error
    assert err.count(b"every job has stopped on an error") == 1, err  # said once, not each second
    assert lock_held == 0  # released when it stopped
    _rules_say(stopped=[0, 1], lock_held=[1, 0])

    # Fixed (init makes the table) and run again: running, in the books too.
    assert b.cli("init") == 0
    assert b.cli("pause", "--job", "job1", "--why", "checking") == 0
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    try:
        _wait("paused in /metrics", lambda: _states(port).get("paused") == 1, proc)
        assert b.cli("resume", "--job", "job1") == 0
        _wait("running in /metrics", lambda: _states(port).get("running") == 1, proc)
        _wait("the rows", lambda: b.count("Orders") == 5, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    capsys.readouterr()
    assert b.cli("status", "--json") == 0
    [job] = json.loads(capsys.readouterr().out)["jobs"]
    assert (job["state"], job["state_reason"]) == ("running", None)


def _rules_say(stopped: list[int], lock_held: list[int]) -> None:
    """`promtool test rules` over the values the run served, 30 minutes each: QBridgeJobStopped
    fires on the stopped job, QBridgeJobLockLost does not (its lock went with the stop)."""
    promtool = promtool_path()
    common = 'instance="q:1", exported_job="job1"'
    rule = next(r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"] if r["alert"] == "QBridgeJobStopped")
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'qbridge_job_state{{{common}, state="stopped"}}', "values": " ".join(f"{v}x30" for v in stopped)},
            {"series": f"qbridge_job_lock_held{{{common}}}", "values": " ".join(f"{v}x30" for v in lock_held)}],
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "QBridgeJobStopped", "exp_alerts": []},
            {"eval_time": "50m", "alertname": "QBridgeJobStopped", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "instance": "q:1", "exported_job": "job1"},
                "exp_annotations": {"summary": "qbridge job job1 stopped on an error and moves nothing",
                                    "description": rule["annotations"]["description"]}}]},
            {"eval_time": "50m", "alertname": "QBridgeJobLockLost", "exp_alerts": []}]}]}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "test.yml"
        path.write_text(yaml.safe_dump(test))
        done = subprocess.run([promtool, "test", "rules", str(path)], check=False, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
