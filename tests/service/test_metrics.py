"""`qbridge run --listen`: Prometheus metrics scraped from a live run agree with `status --json`."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.commands.main import main as cli_main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str, token: str | None = None) -> dict[str, list]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.mark.postgres
@pytest.mark.slow
def test_live_metrics_agree_with_status(make, capsys: pytest.CaptureFixture[str]) -> None:
    b = make(schedule='every = "500ms"', batch_size=50)
    rows = b.ready(120)
    rows[7]["msg_text"] = "{not json"  # one quarantined
    b.insert(rows)
    port = _free_port()
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                m = _scrape(f"http://127.0.0.1:{port}/metrics")
                done = {s.labels["outcome"]: s.value for s in m["qbridge_messages"] if s.name.endswith("_total")}
                if done.get("delivered", 0) + done.get("quarantined", 0) == 120:
                    break
            except (urllib.error.URLError, KeyError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the run never delivered the rows"
            time.sleep(0.3)
        time.sleep(1.0)  # one more tick: last success and lag settle
        m = _scrape(f"http://127.0.0.1:{port}/metrics")
        capsys.readouterr()
        assert cli_main(["status", "-c", str(b.config), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)["jobs"][0]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    q = status["queues"][0]
    by = {(s.labels["queue"], s.labels["outcome"]): s.value for s in m["qbridge_messages"] if s.name.endswith("_total")}
    assert by == {("MQueue1", "delivered"): q["delivered"], ("MQueue1", "skipped"): q["skipped"],
                  ("MQueue1", "quarantined"): q["quarantined"]}
    assert (q["delivered"], q["quarantined"]) == (119, 1)
    assert all(s.labels["direction"] == "to_nservicebus" for s in m["qbridge_messages"])
    assert [s.value for s in m["qbridge_backlog_messages"]] == [q["backlog"]] == [0]
    assert [s.value for s in m["qbridge_open_gaps"]] == [q["open_gaps"]]
    assert [s.value for s in m["qbridge_lag_seconds"]] == [q["lag_seconds"]]
    assert [s.value for s in m["qbridge_job_lock_held"]] == [1.0]
    assert abs(m["qbridge_last_success_timestamp_seconds"][0].value - time.time()) < 30
    batches = [s for s in m["qbridge_batch_duration_seconds"] if s.name.endswith("_count")]
    assert batches and batches[0].value >= 3  # 120 rows in batches of 50
    assert "qbridge_retries" in m


def test_listen_elsewhere_than_loopback_needs_a_token() -> None:
    from bridge.errors import UsageError
    from bridge.service.metrics import MetricsServer, is_loopback, parse_listen

    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464) and parse_listen("[::1]:80") == ("::1", 80)
    assert is_loopback("127.0.0.5") and is_loopback("localhost") and not is_loopback("0.0.0.0")
    with pytest.raises(UsageError, match="needs a token; set QBRIDGE_TOKEN"):
        MetricsServer("0.0.0.0:0", [])
    for bad in ("9464", "host:", "host:99999", ":80", "h:-1"):
        with pytest.raises(UsageError, match="expected HOST:PORT"):
            parse_listen(bad)


def test_a_token_is_required_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.service.metrics import MetricsServer

    monkeypatch.setenv("QBRIDGE_TOKEN", "t0ken")
    server = MetricsServer("127.0.0.1:0", [])
    server.start()
    port = server.server.server_address[1]
    try:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert "qbridge_batch_duration_seconds" in _scrape(f"http://127.0.0.1:{port}/metrics", "t0ken")
    finally:
        server.stop()


def test_without_a_token_only_loopback_names_are_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """A site whose name was re-pointed at 127.0.0.1 (DNS rebinding) reaches the listener with its
    own name in Host: without a token it reads nothing and posts nothing; the probes still answer."""
    from bridge.service.metrics import MetricsServer

    monkeypatch.delenv("QBRIDGE_TOKEN", raising=False)
    server = MetricsServer("127.0.0.1:0", [])
    server.start()
    port = server.server.server_address[1]

    def get(path: str, host: str, method: str = "GET") -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host}, method=method,
                                         data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert get("/", host) == 200 and get("/metrics", host) == 200
        for path, method in (("/", "GET"), ("/status.json", "GET"), ("/metrics", "GET"), ("/actions/pause", "POST")):
            assert get(path, f"rebound.example:{port}", method) == 403, path
        assert get("/healthz", f"rebound.example:{port}") == 200
    finally:
        server.stop()


def test_alert_rules_are_a_prometheus_rule_file_on_our_metrics() -> None:
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).parents[2] / "docs" / "prometheus" / "alerts.yml").read_text())
    [group] = doc["groups"]
    assert group["name"] and set(group) <= {"name", "rules", "interval"}
    names = {"qbridge_lag_seconds", "qbridge_messages_total", "qbridge_last_success_timestamp_seconds", "qbridge_job_held",
             "qbridge_job_paused", "qbridge_job_lock_held", "qbridge_job_state"}
    used = set()
    for rule in group["rules"]:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"].startswith("QBridge") and rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        assert rule.get("for", "1m")[-1] in "smh"
        used |= {n for n in names if n in rule["expr"]}
    assert used == names and len(group["rules"]) == 7


def test_promtool_accepts_the_alert_rules() -> None:
    import subprocess
    from pathlib import Path

    from helpers import promtool_path

    promtool = promtool_path()
    rules = Path(__file__).parents[2] / "docs" / "prometheus" / "alerts.yml"
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout
