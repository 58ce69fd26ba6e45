"""Alerts that reach a person (issue 39), with the real parts: Debian's Prometheus scrapes a real
`qbridge run` with the shipped rules (docs/prometheus/alerts.yml), Debian's Alertmanager routes
what fires to a webhook this test serves, and each condition is provoked until its
notification arrives, then undone until its resolution arrives.

The rules' expressions are the shipped ones; only their durations and thresholds are scaled
down (minutes to seconds), so that the test takes about two minutes rather than hours."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from conftest import IN_CI
from helpers import Bridge
from receivers import PostReceiver
from tests.service.test_metrics import _free_port
from tests.service.test_scheduler import Log, stop, wait_for

RULES = Path(__file__).parents[2] / "docs" / "prometheus" / "alerts.yml"
SCALED = {"for": {"5m": "2s", "1m": "2s", "30m": "2s", "4h": "2s", "2m": "2s"},
          "expr": {"> 60": "> 5", "[15m]": "[20s]", "> 900": "> 6"}}


def _binaries() -> tuple[str, str]:
    prometheus, alertmanager = shutil.which("prometheus"), shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not (prometheus and alertmanager):
        message = "the alert test needs Debian's prometheus and prometheus-alertmanager (run `bash .ci/run`)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return prometheus, alertmanager


class Webhook:
    """Alertmanager's webhook receiver: every notification, as (status, alert name)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

        def take(body: bytes) -> None:
            self.seen += [(alert["status"], alert["labels"]["alertname"]) for alert in json.loads(body)["alerts"]]

        self._http = PostReceiver(take)
        self.url = self._http.url + "/"

    def has(self, status: str, name: str, since: int = 0) -> bool:
        """Whether that notification came, after the first `since` ones."""
        return (status, name) in self.seen[since:]

    def stop(self) -> None:
        self._http.stop()


def scaled_rules(path: Path) -> None:
    doc = yaml.safe_load(RULES.read_text())
    for rule in doc["groups"][0]["rules"]:
        if "for" in rule:
            rule["for"] = SCALED["for"][rule["for"]]
        for old, new in SCALED["expr"].items():
            rule["expr"] = rule["expr"].replace(old, new)
    path.write_text(yaml.safe_dump(doc))


@pytest.mark.slow
def test_each_alert_fires_reaches_a_webhook_and_resolves(tmp_path: Path) -> None:
    prometheus, alertmanager = _binaries()
    hook = Webhook()
    qport, pport, aport = _free_port(), _free_port(), _free_port()
    scaled_rules(tmp_path / "rules.yml")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{aport}"]}]}]},
        "scrape_configs": [{"job_name": "qbridge", "static_configs": [{"targets": [f"127.0.0.1:{qport}"]}]}],
    }))
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump({
        "route": {"receiver": "hook", "group_by": ["alertname"], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": hook.url, "send_resolved": True}]}],
    }))
    # A second job keeps the run going while the first is stopped (a run whose jobs all stopped exits).
    other = ('\n[[jobs]]\nname = "job2"\nsource = { system = "nginn", connection = "legacy", queues = ["MQueue9"], '
             'timezone = "UTC" }\ntarget = { connection = "nsb", flavor = "postgresql" }\nmapping = "mapping.toml"\n'
             'schedule = { every = "1s" }\n')
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "1s"',
               batch_size=1, extra='max_rate = "2/s"\nmax_target_depth = 8\n' + other)
    from bridge.demo.samples import create_nginn_queue

    create_nginn_queue(b.source, "MQueue9")
    assert b.cli("init") == 0
    procs: list[subprocess.Popen] = []
    run = b.spawn("run", "--listen", f"127.0.0.1:{qport}")
    log = Log(run)
    try:
        procs.append(subprocess.Popen([alertmanager, f"--config.file={tmp_path / 'alertmanager.yml'}",
                                       f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{aport}",
                                       "--cluster.listen-address="], stdout=subprocess.DEVNULL,
                                      stderr=(tmp_path / "alertmanager.log").open("w")))
        procs.append(subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}"],
                                      stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w")))

        def waits(status: str, name: str, timeout: float, since: int = 0) -> None:
            try:
                wait_for(f"{name}: {status}", lambda: hook.has(status, name, since), timeout=timeout, proc=run)
            except AssertionError as e:
                logs = "\n".join(f"--- {n}\n" + (tmp_path / n).read_text()[-3000:] for n in ("prometheus.log", "alertmanager.log"))
                raise AssertionError(f"{e}; notifications so far: {hook.seen}\n--- qbridge run\n{log}\n{logs}") from None

        def fires(name: str, timeout: float = 60) -> None:
            waits("firing", name, timeout)

        def resolves(name: str, timeout: float = 60) -> None:
            waits("resolved", name, timeout)

        def query(expr: str) -> list:
            url = f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    return json.loads(r.read())["data"]["result"]
            except OSError:
                return []

        # Prometheus has seen the job's counters at 0 (an increase needs a sample before it)
        wait_for("the first scrapes", lambda: len(query('qbridge_messages_total{outcome="quarantined"}[5s]')[:1]) == 1
                 and len(query('qbridge_messages_total{outcome="quarantined"}[5s]')[0]["values"]) >= 2, proc=run)
        # quarantine growing: a row qbridge cannot read
        bad = b.ready(1, start=900)
        bad[0]["msg_text"] = "{not json"
        b.insert(bad)
        fires("QBridgeQuarantineGrowing")
        # lag and back-pressure: 12 rows a minute old, at 2/s, into a queue no endpoint drains (limit 8)
        old = b.ready(12)
        for r in old:
            r["insert_time"] = b.now_local() - timedelta(seconds=60)
        b.insert(old)
        fires("QBridgeLagHigh")
        fires("QBridgeJobHeld")
        with b.target.begin() as conn:  # an endpoint takes them: the job goes on, drains, lag drops
            conn.execute(sa.text('delete from "Orders"'))
        resolves("QBridgeJobHeld")
        resolves("QBridgeLagHigh")
        resolves("QBridgeQuarantineGrowing")
        # paused too long; and while it is paused, messages wait and the lag grows with their age
        # (issue 46.3: the lag of the last batch froze), until the resumed job moves them
        assert b.cli("pause", "--job", "job1", "--why", "alert test") == 0
        fires("QBridgeJobPausedLong")
        mark = len(hook.seen)
        b.insert(b.ready(3, start=1500))
        waits("firing", "QBridgeLagHigh", 60, since=mark)
        assert b.cli("resume", "--job", "job1") == 0
        resolves("QBridgeJobPausedLong")
        waits("resolved", "QBridgeLagHigh", 60, since=mark)
        # no success: another process holds the legacy database locked (every run waits, fails and
        # backs off: a database that does not answer), then lets go. (A table gone is not retried:
        # the job stops, below.)
        locker = sqlite3.connect(tmp_path / "l.db", isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            fires("QBridgeNoSuccess")
        finally:
            locker.close()  # the lock goes with the connection
        resolves("QBridgeNoSuccess", timeout=120)  # the back-off doubles: 1, 2, 4, 8 s ...
        # stopped: an error waiting cannot fix, which a reload's check of the job finds (the legacy
        # table gone): QBridgeJobStopped fires, and QBridgeJobLockLost does not (the stop released the lock)

        def reload() -> None:
            done = subprocess.run([sys.executable, "-m", "bridge", "reload", "-c", str(b.config)], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr

        def legacy(statement: str) -> None:
            # The running job takes the legacy file's write lock on every pass; on a loaded machine a
            # pass can hold it past sqlite3's 5 s default wait (CI of 2026-11-26: "database is locked").
            conn = sqlite3.connect(tmp_path / "l.db", timeout=60, isolation_level=None)
            try:
                conn.execute(statement)
            finally:
                conn.close()

        legacy('alter table "MQueue1" rename to "MQueue1_away"')
        reload()
        fires("QBridgeJobStopped")
        legacy('alter table "MQueue1_away" rename to "MQueue1"')
        reload()  # a stopped job takes the new config and runs again
        resolves("QBridgeJobStopped")
        assert not hook.has("firing", "QBridgeJobLockLost"), hook.seen

        def holds_job1() -> bool:  # the stop released the lock; the alert resolves once the reload clears the
            # stop, which can be before the job's next tick takes the lock again (its back-off may still run).
            # Unlinking the lock file before then would leave the first run to make a new one, and the taker
            # would stand by for good.
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{qport}/metrics", timeout=5) as r:
                    return 'qbridge_job_lock_held{job="job1"} 1.0' in r.read().decode()
            except OSError:
                return False

        wait_for("the first run holds job1's lock again", holds_job1, timeout=60, proc=run)
        # a lock lost: the lock file removed by a cleaner, and another process takes the job. The first
        # run learns of it only when a batch of its own meets the new epoch (the fence), so rows keep
        # coming until it has; the taker is a second `qbridge run`, which keeps the job until it stops
        # (a `sync --once` would let go when its rows ran out, and the race with the first run's ticks
        # decided whether the alert could fire at all).
        with b.target.begin() as conn:
            conn.execute(sa.text('delete from "Orders"'))
        lock = next(p for p in tmp_path.glob("n.db.*.lock") if "job1" in p.name)
        lock.unlink()
        taker_config = tmp_path / "taker.toml"
        taker_config.write_text(b.config.read_text().replace("max_target_depth = 8\n", ""))
        taker_log = tmp_path / "taker.log"
        taker = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(taker_config)], cwd=tmp_path,
                                 stdout=subprocess.DEVNULL, stderr=taker_log.open("w"))
        procs.append(taker)
        feed = iter(range(2000, 2600))

        def lost() -> bool:  # a message comes, and an endpoint takes what arrived (no back-pressure holds the first run)
            assert taker.poll() is None, f"the taker exited ({taker.returncode}):\n{taker_log.read_text()[-3000:]}"
            b.insert(b.ready(1, start=next(feed)))
            with b.target.begin() as conn:
                conn.execute(sa.text('delete from "Orders"'))
            return hook.has("firing", "QBridgeJobLockLost")

        try:
            wait_for("QBridgeJobLockLost: firing", lost, timeout=90, proc=run)
        except AssertionError as e:
            raise AssertionError(f"{e}; notifications so far: {hook.seen}\n--- the taker\n{taker_log.read_text()[-3000:]}"
                                 f"\n--- qbridge run\n{log}") from None
        assert taker.poll() is None
        taker.terminate()
        assert taker.wait(60) == 0  # SIGTERM: the taker finishes its batch and lets go; the first run takes the job back
        resolves("QBridgeJobLockLost")
    finally:
        stop(run, log)
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(30)
        hook.stop()
    names = {name for _, name in hook.seen}
    assert names == {r["alert"] for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}, hook.seen


def test_the_documented_alertmanager_route_is_valid_and_sends_critical_alerts_to_both(tmp_path: Path) -> None:
    """docs/running.md's route, checked by Alertmanager's own amtool: valid, every alert in the
    chat, critical ones to on-call as well (a matching child route ends the search unless it
    says `continue`, and the parent's receiver is then not used)."""
    import re

    amtool = shutil.which("amtool")
    if amtool is None:
        message = "this test needs amtool from Debian's prometheus-alertmanager (run `bash .ci/run`)"
        (pytest.fail if IN_CI else pytest.skip)(message)
    text = (Path(__file__).parents[2] / "docs" / "running.md").read_text()
    config = tmp_path / "alertmanager.yml"
    config.write_text(re.search(r"```yaml\n(route:.*?)```", text, re.S).group(1))
    checked = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    def receivers(*labels: str) -> set[str]:
        r = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}", *labels], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return set(r.stdout.strip().split(","))

    assert receivers("alertname=QBridgeJobLockLost", "severity=critical") == {"qbridge-oncall", "qbridge-chat"}
    assert receivers("alertname=QBridgeLagHigh", "severity=warning") == {"qbridge-chat"}
