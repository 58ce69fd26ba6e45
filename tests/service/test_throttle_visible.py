"""A throttled job is seen for what it is (issue 46.8): its max_rate in /metrics
(`qbridge_job_max_rate`, and `qbridge_job_throttled_seconds_total`, which only grows, across a
reload too), in /status.json, `status --json` and on the page; a throttled drain does not fill
the log with APScheduler's "maximum number of running instances reached"; and a reload logs what
it changed, setting by setting, or that nothing did."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import urllib.request
from contextlib import redirect_stdout
from pathlib import Path

from bridge.commands.main import main as cli_main
from helpers import Bridge
from tests.service.test_metrics import _free_port, _scrape
from tests.service.test_scheduler import Log, stop, wait_for


def test_max_rate_is_seen_and_a_reload_says_what_changed(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "1s"',
               batch_size=50, extra='max_rate = "2/s"\n')
    assert b.cli("init") == 0
    b.insert(b.ready(30))  # 15 s of work at 2/s: several ticks find the drain still running
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    log = Log(proc)

    def metric(name: str) -> float | None:
        samples = _scrape(f"{base}/metrics").get(name, [])
        return samples[0].value if samples else None

    try:
        wait_for("the page", lambda: log.has("status page on"), proc=proc)
        wait_for("a throttled wait", lambda: (metric("qbridge_job_throttled_seconds") or 0) > 2, proc=proc)
        assert metric("qbridge_job_max_rate") == 2.0
        with urllib.request.urlopen(f"{base}/status.json", timeout=10) as r:
            [job] = json.loads(r.read())["jobs"]
        assert job["max_rate"] == "2/s"
        with urllib.request.urlopen(f"{base}/", timeout=10) as r:
            assert "max_rate 2/s" in r.read().decode()
        out = io.StringIO()
        with redirect_stdout(out):
            assert b.cli("status", "--json") == 0  # another process reads it from the config it runs
        assert json.loads(out.getvalue())["jobs"][0]["max_rate"] == "2/s"

        before = metric("qbridge_job_throttled_seconds") or 0
        b.config.write_text(b.config.read_text().replace('max_rate = "2/s"', 'max_rate = "5/s"'))
        r = subprocess.run([sys.executable, "-m", "bridge", "reload", "-c", str(b.config)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        wait_for("the reload's line", lambda: log.has("config reloaded"), proc=proc)
        assert log.has("max_rate: '2/s' -> '5/s'"), log
        wait_for("the new rate", lambda: metric("qbridge_job_max_rate") == 5.0, proc=proc)
        assert (metric("qbridge_job_throttled_seconds") or 0) >= before  # a counter: the reload took none off
        subprocess.run([sys.executable, "-m", "bridge", "reload", "-c", str(b.config)], capture_output=True, timeout=60)
        wait_for("the second reload's line", lambda: log.has("config reloaded: nothing changed"), proc=proc)
        wait_for("every row", lambda: b.count("Orders") == 30, proc=proc)
    finally:
        stop(proc, log)
    assert not log.has("maximum number of running instances"), log
