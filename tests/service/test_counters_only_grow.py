"""A Prometheus counter only grows (issue 46, finding 1): `qbridge_messages_total{outcome}` counts
what ever had each outcome, so a discard, a replay or a rollback takes nothing off it; what is in
quarantine now is the gauge `qbridge_quarantined_messages`. Before, the counter went 21 -> 20 on a
discard and the shipped QBridgeQuarantineGrowing fired "quarantined 20 messages in 15 minutes"
on it: every replay or discard paged someone. The series a live `qbridge run` served through a
discard and a replay are fed to the shipped rule with `promtool test rules`."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
import urllib.error
from pathlib import Path

import pytest
import yaml
from helpers import MAPPING, Bridge, promtool_path

from tests.service.test_metrics import _free_port, _scrape

UNROUTED = MAPPING.replace('"*"       = "Unrouted"\n', "")  # MQueue3 has no route: its messages are quarantined
FIXED = MAPPING.replace('"*"       = "Unrouted"\n', '"MQueue3" = "Orders"\n')
RULES = Path(__file__).parents[2] / "docs" / "prometheus" / "alerts.yml"


def _counts(port: int) -> dict[str, float]:
    m = _scrape(f"http://127.0.0.1:{port}/metrics")
    out = {s.labels["outcome"]: s.value for s in m["qbridge_messages"] if s.name.endswith("_total")
           and s.labels["queue"] == "MQueue3"}
    out["now"] = sum(s.value for s in m["qbridge_quarantined_messages"] if s.labels["queue"] == "MQueue3")
    return out


def _settled(port: int, proc: subprocess.Popen[bytes], want: dict[str, float], seconds: float = 60) -> dict[str, float]:
    """The scrape once the status cache (5 s) shows `want`."""
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            got = _counts(port)
            if all(got.get(k) == v for k, v in want.items()):
                return got
        except (urllib.error.URLError, KeyError, ConnectionError):
            got = {}
        assert time.monotonic() < deadline, got
        time.sleep(0.5)


@pytest.mark.postgres
@pytest.mark.slow
def test_discard_replay_and_rollback_take_nothing_off_the_counters(make, capsys: pytest.CaptureFixture[str]) -> None:
    b: Bridge = make(queues=["MQueue1", "MQueue3"], mapping=UNROUTED, schedule='every = "1s"', batch_size=50)
    b.insert(b.ready(21, queue="MQueue3"), queue="MQueue3")
    port = _free_port()
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    try:
        quarantined = _settled(port, proc, {"quarantined": 21, "now": 21})
        capsys.readouterr()
        assert b.cli("quarantine", "list", "--json") == 0
        ids = [q["message_id"] for q in json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]]
        assert b.cli("quarantine", "discard", "--id", ids[0], "--why", "a test message") == 0
        discarded = _settled(port, proc, {"now": 20})
        (b.tmp / "mapping.toml").write_text(FIXED)  # the command's config; the run goes on as it was
        assert b.cli("quarantine", "replay", "--id", ids[1]) == 0
        replayed = _settled(port, proc, {"now": 19})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert quarantined["quarantined"] == discarded["quarantined"] == replayed["quarantined"] == 21
    assert (discarded["skipped"], replayed["delivered"]) == (1, 1)  # the discard is a skip, the replay a delivery
    assert _alert_fires_once(quarantined["quarantined"], discarded["quarantined"], replayed["quarantined"])

    # A rollback withdraws a delivered message: `status --json` keeps it in `ever`, Prometheus's counter too.
    capsys.readouterr()
    assert b.cli("rollback", "--yes", "--job", "job1", "--queue", "MQueue3") == 0
    capsys.readouterr()
    assert b.cli("status", "--json") == 0
    [q] = [q for q in json.loads(capsys.readouterr().out)["jobs"][0]["queues"] if q["queue"] == "MQueue3"]
    assert (q["delivered"], q["quarantined"]) == (0, 19)
    assert q["ever"] == {"delivered": 1, "skipped": 1, "quarantined": 21}


def _alert_fires_once(*values: float) -> bool:
    """`promtool test rules`: the shipped QBridgeQuarantineGrowing over the counter's values as the
    live run served them (21 quarantined, then a discard, then a replay, 30 minutes apart): it
    fires for the 21, and neither the discard nor the replay fires it again."""
    promtool = promtool_path()
    series = "0x10 " + " ".join(f"{int(v)}x30" for v in values)
    labels = '{instance="q:1", exported_job="job1", queue="MQueue3", outcome="quarantined"}'
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f"qbridge_messages_total{labels}", "values": series}],
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "QBridgeQuarantineGrowing", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "instance": "q:1", "exported_job": "job1", "queue": "MQueue3"},
                "exp_annotations": {
                    "summary": "qbridge job1/MQueue3 quarantined 21 messages in 15 minutes",
                    "description": next(r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
                                        if r["alert"] == "QBridgeQuarantineGrowing")["annotations"]["description"]}}]},
            {"eval_time": "50m", "alertname": "QBridgeQuarantineGrowing", "exp_alerts": []},  # after the discard
            {"eval_time": "80m", "alertname": "QBridgeQuarantineGrowing", "exp_alerts": []},  # after the replay
        ]}]}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "test.yml"
        path.write_text(yaml.safe_dump(test))
        done = subprocess.run([promtool, "test", "rules", str(path)], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return True


def test_the_rule_would_have_paged_on_the_old_counter() -> None:
    """Not vacuous: the same rule over a counter that went 21 -> 20 on a discard fires again."""
    with pytest.raises(AssertionError, match="QBridgeQuarantineGrowing"):
        _alert_fires_once(21, 20, 19)
