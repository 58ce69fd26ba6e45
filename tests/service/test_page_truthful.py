"""The status page tells the truth and keeps what an operator types (issue 46.6), in a real
headless Chromium: its reload every 10 s never wipes a half-typed "why"; right after a pause
the state cell says paused and the button says resume (the books are read afresh after an
action, not 5 s old); paused and held are amber, not green; what the action said is shown once."""

from __future__ import annotations

import time

import pytest

from tests.service.test_metrics import _free_port
from tests.service.test_scheduler import Log, stop, wait_for


@pytest.mark.postgres
@pytest.mark.slow
def test_typing_survives_the_reload_and_a_pause_shows_at_once(make, browser) -> None:
    from selenium.webdriver.common.by import By

    b = make(schedule='every = "1s"', batch_size=50, extra='max_rate = "100/s"\n')
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    log = Log(proc)

    def cell():
        return browser.find_element(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] td[data-field="state"]')

    def generated() -> str:
        return browser.find_element(By.ID, "generated").text

    try:
        wait_for("the page", lambda: log.has("status page on"), proc=proc)
        wait_for("the first run", lambda: log.has("scheduled"), proc=proc)
        browser.get(f"{base}/")
        assert cell().text == "running · max_rate 100/s" and cell().get_attribute("class") == "ok"
        first = generated()
        form = browser.find_element(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] form.pause')
        form.find_element(By.NAME, "by").send_keys("dana")
        why = form.find_element(By.NAME, "why")
        why.send_keys("endpoint redep")  # half-typed, the focus still in the field
        time.sleep(12)  # past the 10 s reload
        assert generated() == first, "the page reloaded under the operator's hands"
        why = browser.find_element(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] form.pause input[name="why"]')
        assert why.get_attribute("value") == "endpoint redep"
        why.send_keys("loy")
        browser.find_element(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] form.pause button').click()
        wait_for("the page after the pause", lambda: "said=" in browser.current_url)
        # the first page after the 303: the state the action produced, and the button that undoes it
        state = cell()
        assert state.text.startswith("paused by dana") and "endpoint redeploy" in state.text, state.text
        assert state.get_attribute("class") == "warn"
        assert browser.find_elements(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] form.resume')
        assert not browser.find_elements(By.CSS_SELECTOR, 'table.overview tr[data-job="job1"] form.pause')
        assert "job job1 paused" in browser.find_element(By.CSS_SELECTOR, "p.said").text
        assert browser.find_element(By.CSS_SELECTOR, ".meta span.warn span.state").text.startswith("paused by dana")
        # nothing typed, no focus: the page reloads, and what the action said is not said again
        browser.execute_script("document.activeElement && document.activeElement.blur()")
        wait_for("the reload", lambda: "said=" not in browser.current_url, timeout=25)
        assert not browser.find_elements(By.CSS_SELECTOR, "p.said")
        assert cell().text.startswith("paused by dana")
    finally:
        stop(proc, log)
