"""The status page acts (issue 38), in a real headless Chromium: an overview table of the jobs at
the top, pause and resume a job, replay a failure group, each audited with who did it; a job
that moved nothing says so instead of drawing an empty chart; and a request from another site,
or without the page's form token, or without QBRIDGE_TOKEN, is refused."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import sqlalchemy as sa

from helpers import MAPPING
from tests.service.test_metrics import _free_port
from tests.service.test_scheduler import Log, stop, wait_for
from tests.service.test_status_page import ARTIFACTS

NO_CATCH_ALL = MAPPING.replace('"*"       = "Unrouted"\n', "")
TOKEN = "page-s3cret"


def _post(url: str, data: bytes, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.postgres
@pytest.mark.slow
def test_pause_resume_and_replay_a_group_from_the_page(make, browser, monkeypatch: pytest.MonkeyPatch) -> None:
    from selenium.webdriver.common.by import By

    b = make(queues=["MQueue1", "MQueue3"], mapping=NO_CATCH_ALL, schedule='every = "1s"', batch_size=50)
    monkeypatch.setenv("QBRIDGE_TOKEN", TOKEN)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    log = Log(proc)

    def page() -> None:
        browser.get(f"{base}/?token={TOKEN}")

    def state() -> str:
        """The job's state cell, or "" while a form's POST and its 303 back are still loading (CI caught a read then)."""
        from selenium.common.exceptions import StaleElementReferenceException

        cells = browser.find_elements(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] td[data-field="state"]')
        try:
            return cells[0].text if cells else ""
        except StaleElementReferenceException:
            return ""

    def shown() -> str:
        return browser.find_element(By.TAG_NAME, "body").text[:2000]

    try:
        wait_for("the page", lambda: log.has("status page on"), proc=proc)
        wait_for("the first run", lambda: log.has("scheduled"), proc=proc)
        time.sleep(1.5)
        page()
        assert browser.find_element(By.CSS_SELECTOR, 'p.idle[data-job="job1"]').is_displayed()  # nothing moved yet
        assert not browser.find_elements(By.CSS_SELECTOR, 'svg.chart[data-job="job1"]')
        overview = browser.find_element(By.CSS_SELECTOR, "table.overview")
        assert overview.location["y"] < browser.find_element(By.ID, "job-job1").location["y"], "the overview comes first"
        assert state() == "running"

        # pause from the page
        form = browser.find_element(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] form.pause')
        form.find_element(By.NAME, "by").send_keys("dana")
        form.find_element(By.NAME, "why").send_keys("endpoint redeploy")
        form.find_element(By.TAG_NAME, "button").click()
        try:
            wait_for("the paused page", lambda: "paused by dana" in state())
        except AssertionError:
            raise AssertionError(f"the page after pause showed:\n{shown()}\n{log}") from None
        assert "endpoint redeploy" in state()
        assert "job job1 paused" in browser.find_element(By.CSS_SELECTOR, "p.said").text
        b.insert(b.ready(20))
        b.insert(b.ready(30, queue="MQueue3"), queue="MQueue3")
        time.sleep(2.5)
        assert b.count("Orders") == 0, "the job moved messages while paused from the page"

        # resume from the page
        page()
        form = browser.find_element(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] form.resume')
        form.find_element(By.NAME, "by").send_keys("dana")
        form.find_element(By.TAG_NAME, "button").click()
        try:
            wait_for("the rows", lambda: b.count("Orders") == 20 and b.ledger()["quarantined"] == 30, proc=proc)
        except AssertionError:
            raise AssertionError(f"{b.count('Orders')} {b.ledger()} {state()}\n{log}") from None

        # fix the mapping, reload, and replay the group from the page
        (b.tmp / "mapping.toml").write_text(MAPPING)
        assert b.cli("init") == 0
        r = subprocess.run([sys.executable, "-m", "bridge", "reload", "-c", str(b.config)], cwd=b.tmp, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        wait_for("the reload", lambda: log.has("config reloaded"), proc=proc)
        time.sleep(2.5)  # a tick takes the new config
        page()
        row = browser.find_element(By.CSS_SELECTOR, "table.groups tr.group")
        assert row.find_element(By.CSS_SELECTOR, "td.n").text == "30"
        form = row.find_element(By.CSS_SELECTOR, "form.replay-group")
        form.find_element(By.NAME, "by").send_keys("erin")
        form.find_element(By.TAG_NAME, "button").click()
        wait_for("the replay", lambda: b.count("Unrouted") == 30, proc=proc)
        wait_for("the replay's end", lambda: "30 of 30, done" in (page() or browser.find_element(By.CSS_SELECTOR, "ul.operations").text))
        assert not browser.find_elements(By.CSS_SELECTOR, "table.groups tr.group")
        assert browser.find_element(By.CSS_SELECTOR, 'svg.chart[data-job="job1"]').is_displayed()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "status-page-actions.png"))

        # refused: no form token, another site, no QBRIDGE_TOKEN
        html = urllib.request.urlopen(f"{base}/?token={TOKEN}", timeout=10).read().decode()
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)
        form = f"job=job1&by=mallory&why=x&csrf={csrf}".encode()
        assert _post(f"{base}/actions/pause?token={TOKEN}", b"job=job1&by=mallory&why=x") == 403
        assert _post(f"{base}/actions/pause?token={TOKEN}", form, {"Origin": "http://evil.example"}) == 403
        assert _post(f"{base}/actions/pause?token={TOKEN}", form, {"Sec-Fetch-Site": "cross-site"}) == 403
        assert _post(f"{base}/actions/pause", form) == 401
        assert _post(f"{base}/actions/pause?token={TOKEN}", form) == 200  # the 303 back to the page, followed
    finally:
        stop(proc, log)
    with b.target.connect() as conn:
        audit = conn.execute(sa.text(f'select action, actor, why from "{b.target_schema}".qbridge_steering_audit order by id')).all()
    actions = [(a, actor.split(" ")[0], why) for a, actor, why in audit]
    assert actions == [("paused", "dana", "endpoint redeploy"), ("resumed", "dana", None), ("replayed group", "erin", None),
                       ("paused", "mallory", "x")]
    assert all("(status page, from 127.0.0.1)" in actor for _, actor, _ in audit)
    assert b.ledger()["delivered"] == 50 and b.ledger()["quarantined"] == 0
    assert b.cli("verify") == 0


def test_the_overview_says_what_holds_a_job_and_for_how_long() -> None:
    from types import SimpleNamespace

    from bridge.service.statuspage import History, render

    lock = SimpleNamespace(held=True, holder=lambda: "this process")
    runner = SimpleNamespace(job=SimpleNamespace(reverse=False, mode="copy"), target_engine=None, state=None)
    worker = SimpleNamespace(name="orders", runner=runner, failures=0, stopped_reason=None, last_success=None,
                             last_error=None, retries={}, lock=lock, allowance=60.0)
    books = {"lag_seconds": 0.0, "source_error": None, "quarantined": 0, "backlog": 12, "rows_moved": 5_000, "queues": [],
             "steering": {"paused": False, "paused_by": None, "paused_at": None, "why": None,
                          "held": "Orders holds 5,000 of 5,000", "held_since": "2026-11-25T08:00:00Z", "held_seconds": 90.0}}
    page = render("t", [worker], History(), lambda w: books)
    assert "held: Orders holds 5,000 of 5,000 since 2026-11-25 08:00:00 UTC; 90 s held before this hold" in page
    assert 'class="warn" data-field="state"' in page  # held: amber, neither green nor the red of a failure
