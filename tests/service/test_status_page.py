"""The status page of `qbridge run --listen`, opened in a real headless Chromium: its numbers
equal `qbridge status --json`, the hour's chart draws, a quarantined row's reason is on it, and
it refreshes by itself. A screenshot is kept in test-artifacts/ (QBRIDGE_ARTIFACTS)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bridge.commands.main import main as cli_main
from tests.service.test_metrics import _free_port

ARTIFACTS = Path(os.environ.get("QBRIDGE_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


def _status_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _wait_delivered(url: str, n: int, proc) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            q = _status_json(url)["jobs"][0]["queues"][0]
            if q["delivered"] + q["quarantined"] == n and q["backlog"] == 0:
                return
        except (urllib.error.URLError, ConnectionError, KeyError, IndexError):
            pass
        assert time.monotonic() < deadline, f"the run never moved {n} rows"
        time.sleep(0.3)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_page_shows_what_status_says_draws_the_hour_and_the_quarantine(make, browser, capsys) -> None:
    from selenium.webdriver.common.by import By

    b = make(schedule='every = "500ms"', batch_size=40)
    rows = b.ready(120)
    rows[7]["msg_text"] = "{not json"
    b.insert(rows)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    try:
        _wait_delivered(f"{base}/status.json", 120, proc)
        time.sleep(0.6)  # one idle tick after the last batch
        browser.get(f"{base}/")
        capsys.readouterr()
        assert cli_main(["status", "-c", str(b.config), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)["jobs"][0]

        row = browser.find_element(By.CSS_SELECTOR, 'tr[data-job="job1"][data-queue="MQueue1"]')
        shown = {td.get_attribute("data-field"): td for td in row.find_elements(By.CSS_SELECTOR, "td[data-field]")}
        q = status["queues"][0]
        for field in ("backlog", "delivered", "skipped", "quarantined", "open_gaps"):
            assert shown[field].text == str(q[field]), field
        assert shown["lag_seconds"].text == f"{q['lag_seconds']:.1f} s"
        assert (q["delivered"], q["quarantined"], q["backlog"]) == (119, 1, 0)
        from datetime import datetime

        on_page = datetime.fromisoformat(shown["last_run"].text.removesuffix(" UTC") + "+00:00")
        assert abs((on_page - datetime.fromisoformat(q["last_run"])).total_seconds()) < 10  # it runs every 500 ms
        assert "this process" in browser.find_element(By.CSS_SELECTOR, '.lock[data-job="job1"]').text

        chart = browser.find_element(By.CSS_SELECTOR, 'svg.chart[data-job="job1"]')
        assert chart.is_displayed() and chart.size["width"] > 600 and chart.size["height"] > 150
        bars = chart.find_elements(By.CSS_SELECTOR, "rect.throughput")
        assert bars and all(bar.size["height"] > 0 for bar in bars)
        assert sum(int(bar.find_element(By.TAG_NAME, "title").get_attribute("textContent").split()[0]) for bar in bars) == 119
        assert chart.find_elements(By.CSS_SELECTOR, "circle.lag")  # the lag line has points

        [quarantined] = browser.find_elements(By.CSS_SELECTOR, "tr.quarantined")
        reason = quarantined.find_element(By.CSS_SELECTOR, "td.reason")
        assert reason.is_displayed() and "not valid JSON" in reason.text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "status-page.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

        # It refreshes by itself: new rows show up without anyone reloading the page.
        generated = browser.find_element(By.ID, "generated").text
        b.insert(b.ready(30, start=200))
        _wait_delivered(f"{base}/status.json", 150, proc)
        deadline = time.monotonic() + 30
        while browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="MQueue1"] td[data-field="delivered"]').text != "149":
            assert time.monotonic() < deadline, "the page did not refresh by itself"
            time.sleep(0.5)
        assert browser.find_element(By.ID, "generated").text != generated

        # Read-only: nothing but GET and HEAD.
        with pytest.raises(urllib.error.HTTPError, match="405"):
            urllib.request.urlopen(urllib.request.Request(f"{base}/", data=b"x", method="POST"), timeout=5)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]


def test_a_token_opens_the_page_from_a_browser_address(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.service.metrics import MetricsServer

    monkeypatch.setenv("QBRIDGE_TOKEN", "t0ken")
    server = MetricsServer("127.0.0.1:0", [], "test.toml")
    server.start()
    base = f"http://127.0.0.1:{server.server.server_address[1]}"
    try:
        for path in ("/", "/status.json", "/?token=wrong"):
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(base + path, timeout=5)
        with urllib.request.urlopen(f"{base}/?token=t0ken", timeout=5) as r:
            page = r.read().decode()
        assert "qbridge · test.toml" in page and "Nothing is quarantined" in page
        with urllib.request.urlopen(f"{base}/status.json?token=t0ken", timeout=5) as r:
            assert json.loads(r.read()) == {"jobs": []}
    finally:
        server.stop()


def test_history_keeps_one_hour_in_minutes() -> None:
    from bridge.pipeline.loop import PassStats
    from bridge.service.statuspage import History, chart

    now = [1_800_000_000.0]
    h = History(clock=lambda: now[0])
    s = PassStats("q")
    s.delivered, s.lag_seconds = 10, 2.5
    h.batch("j", s)
    h.batch("j", s)
    now[0] += 61
    h.lag("j", 0.0)
    series = h.series("j")
    assert len(series) == 60 and (series[-2].delivered, series[-2].lag) == (20, 2.5) and series[-1].lag == 0.0
    now[0] += 3600
    assert all(m.delivered == 0 and m.lag is None for m in h.series("j"))  # an hour later it has all aged out
    svg = chart("j", series)
    assert svg.count('class="throughput"') == 1 and "max 20" in svg


@pytest.mark.postgres
def test_a_stopped_job_shows_why_and_a_down_database_does_not_take_the_page(make) -> None:
    import threading

    import sqlalchemy as sa

    from bridge.lifecycle.verify import status
    from bridge.service.scheduler import JobWorker
    from bridge.service.statuspage import History, render

    b = make()
    with b.source.begin() as conn:  # the legacy queue table is gone: the job stops with the reason
        conn.execute(sa.text(f'DROP TABLE "{b.source_schema}"."MQueue1"'))
    worker = JobWorker(b.runner(), threading.Event())
    worker.tick()
    assert worker.stopped_reason
    page = render("t.toml", [worker], History(), lambda w: status(w.runner))
    assert "stopped: " in page and "MQueue1" in page and "database unreachable or failing" in page
    assert "nobody" in page  # the lock was released when the job stopped


@pytest.mark.parametrize("server", ["pg_server", "mariadb_database"])
def test_the_page_names_who_holds_a_jobs_lock(server: str, request: pytest.FixtureRequest) -> None:
    import sqlalchemy as sa

    from bridge.ledger.joblock import JobLock

    url = request.getfixturevalue(server)
    mine, theirs = sa.create_engine(url), sa.create_engine(url)
    holder, other = JobLock(mine, "status-page-lock"), JobLock(theirs, "status-page-lock")
    try:
        assert other.holder() == "nobody"
        assert holder.ensure() and not other.ensure()
        assert holder.holder().startswith("this process (qbridge run on ")
        named = other.holder()
        if server == "pg_server":  # PostgreSQL knows the holder by its application_name
            assert named.startswith("qbridge run on ") and f"pid {os.getpid()}" in named and "backend pid" in named
        else:
            assert named.startswith("another process (connection ")
        holder.release()
        assert other.holder() == "nobody"
    finally:
        holder.release()
        other.release()
        mine.dispose()
        theirs.dispose()
