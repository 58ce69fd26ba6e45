"""The listener's shared reading of a job's books (bridge.service.status_cache): read at most once
per interval, never by a scrape once there are books (a scrape that waits past Prometheus's
scrape_timeout makes every series stale and every alert flap), never stale for ever, and a
failure shown rather than hidden."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import Bridge

from bridge.service.status_cache import StaleBooks, StatusCache


def _settle(cache: StatusCache, name: str = "j", within: float = 10.0) -> None:
    """Until no reading of the job runs in the background."""
    flight = cache._flights.get(name)
    if flight is not None:
        assert flight.landed.wait(within), "the background reading never finished"


class _Counting:
    """A reading whose books say how many readings there were: {"n": 1}, {"n": 2} ..."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, runner: int) -> dict:
        self.calls += 1
        return {"n": self.calls}


def _cannot_start(self: threading.Thread) -> None:  # Thread.start under a pids or memory limit
    raise RuntimeError("can't start new thread")


def test_books_are_read_once_per_interval_and_a_caller_never_waits_once_there_are_some() -> None:
    now = [0.0]
    calls: list[int] = []
    started, release = threading.Event(), threading.Event()

    def slow(runner: int) -> dict:
        calls.append(runner)
        if len(calls) == 2:  # the second reading hangs until released
            started.set()
            release.wait(10)
        return {"n": len(calls)}

    cache = StatusCache(slow, fresh=5.0, clock=lambda: now[0])
    assert cache.get("j", 1) == {"n": 1} and cache.get("j", 1) == {"n": 1} and calls == [1]
    now[0] = 6.0
    t0 = time.monotonic()
    assert cache.get("j", 1) == {"n": 1}  # expired: the last books at once, a new reading begun
    assert started.wait(5) and time.monotonic() - t0 < 5
    assert cache.get("j", 1) == {"n": 1} and cache.get("j", 1) == {"n": 1}  # and only one reading
    assert calls == [1, 1]
    release.set()
    _settle(cache)
    assert cache.get("j", 1) == {"n": 2} and len(calls) == 2


def test_books_that_take_long_to_read_are_read_less_often() -> None:
    clock = [100.0]

    def takes_ten_seconds(runner: int) -> dict:
        clock[0] += 10
        return {"at": clock[0]}

    cache = StatusCache(takes_ten_seconds, fresh=5.0, clock=lambda: clock[0])
    first = cache.get("j", 1)
    clock[0] += 39  # 4x the 10 s it took: not yet
    assert cache.get("j", 1) == first
    _settle(cache)
    assert cache.get("j", 1) == first
    clock[0] += 2
    assert cache.get("j", 1) == first  # expired: this caller still gets the last ones
    _settle(cache)
    assert cache.get("j", 1) != first


def test_a_reading_that_hangs_makes_the_books_stale_rather_than_frozen() -> None:
    now = [0.0]
    release = threading.Event()
    calls = [0]

    def hangs_the_second_time(runner: int) -> dict:
        calls[0] += 1
        if calls[0] == 2:
            release.wait(10)
        return {"lag": calls[0]}

    cache = StatusCache(hangs_the_second_time, fresh=5.0, clock=lambda: now[0], max_age=60.0)
    assert cache.get("j", 1) == {"lag": 1}
    now[0] = 30.0
    assert cache.get("j", 1) == {"lag": 1}  # the reading that hangs begins
    now[0] = 89.0
    assert cache.get("j", 1) == {"lag": 1}  # it has run 59 s
    now[0] = 91.0
    with pytest.raises(StaleBooks, match=r"last read 91 s ago, and reading them again has not finished in 61 s"):
        cache.get("j", 1)
    release.set()
    _settle(cache)
    assert cache.get("j", 1) == {"lag": 2}


def test_a_failed_reading_is_raised_to_every_caller_until_a_reading_succeeds() -> None:
    now = [0.0]
    down = [True]
    calls = [0]

    def books(runner: int) -> dict:
        calls[0] += 1
        if down[0]:
            raise ConnectionError("the ledger's database does not answer")
        return {"ok": calls[0]}

    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0])
    for _ in range(3):
        with pytest.raises(ConnectionError, match="does not answer") as caught:
            cache.get("j", 1)
    assert calls[0] == 1  # kept for `fresh` seconds: the database is not asked by every scrape
    depth = len(list(_frames(caught.value.__traceback__)))
    with pytest.raises(ConnectionError) as again:
        cache.get("j", 1)
    assert len(list(_frames(again.value.__traceback__))) == depth  # raised again, its traceback does not grow
    down[0] = False
    now[0] = 6.0
    with pytest.raises(ConnectionError):  # expired: a new reading begins; this caller gets what stands
        cache.get("j", 1)
    _settle(cache)
    assert cache.get("j", 1) == {"ok": 2}


def _frames(tb):  # type: ignore[no-untyped-def]
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_after_an_action_the_next_caller_reads_afresh_and_a_reading_begun_before_is_not_kept() -> None:
    now = [0.0]
    state = {"paused": False}
    started, release = threading.Event(), threading.Event()
    calls = [0]

    def books(runner: int) -> dict:
        calls[0] += 1
        seen = dict(state)
        if calls[0] == 2:  # begun before the action, finished after it
            started.set()
            release.wait(10)
        return seen

    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0])
    assert cache.get("j", 1) == {"paused": False}
    now[0] = 6.0
    cache.get("j", 1)
    assert started.wait(5)
    state["paused"] = True
    cache.forget()
    release.set()
    _settle(cache)
    assert cache.get("j", 1) == {"paused": True}


# -- found by a review (helper-36) of the first version ------------------------------------------
# -- 1 -------------------------------------------------------------------------------------------

def test_books_are_not_stale_when_no_reading_hangs_only_because_nobody_asked_for_a_minute() -> None:
    """Prometheus's default scrape_interval is 1m: each scrape finds the books one interval old
    (less the few ms the reading took), and starts the next reading. None of them hangs."""
    now = [0.0]
    books = _Counting()
    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0], max_age=60.0)
    assert cache.get("j", 1) == {"n": 1}
    stale = []
    for scrape in range(1, 6):
        now[0] = scrape * 60.5  # a scrape a minute, half a second late
        try:
            cache.get("j", 1)
        except StaleBooks as e:
            stale.append(str(e))
        _settle(cache)  # the reading it started finished at once
    assert books.calls == 6  # every scrape started a reading, and every one of them finished
    assert stale == [], f"{len(stale)} of 5 scrapes got StaleBooks with no reading hanging: {stale[0]}"


def test_a_paused_job_is_not_shown_running_on_metrics_after_a_quiet_minute(tmp_path: Path) -> None:
    """The same through /metrics' collector, on real SQLite books: a job an operator paused reads
    as qbridge_job_state{state="running"} and loses qbridge_job_paused, because the collector
    takes StaleBooks as a database that is down (books = {"queues": []})."""
    from bridge.lifecycle.verify import status
    from bridge.service.metrics import BridgeCollector

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.insert(b.ready(3))
    assert b.cli("sync", "--once") == 0
    runner = b.runner()
    runner.state.steering.set_paused(runner.target_engine, "job1", True, "op", "maintenance window")
    worker = SimpleNamespace(name="job1", runner=runner, failures=0, stopped_reason=None, last_success=time.time(),
                             last_error=None, retries={}, allowance=60.0, lock=SimpleNamespace(held=True))
    now = [0.0]
    cache = StatusCache(status, clock=lambda: now[0])
    collector = BridgeCollector([worker], lambda w: cache.get(w.name, w.runner))

    def scrape() -> tuple[str, list[float]]:
        families = {f.name: f for f in collector.collect()}
        state = [s.labels["state"] for s in families["qbridge_job_state"].samples if s.value == 1.0]
        return state[0], [s.value for s in families["qbridge_job_paused"].samples]

    assert scrape() == ("paused", [1.0])
    now[0] = 61.0  # the next scrape, a minute later (scrape_interval: 1m)
    got = scrape()
    _settle(cache, "job1", within=30)
    assert got == ("paused", [1.0]), f"a paused job scraped a minute later reads as {got}"


# -- 2 -------------------------------------------------------------------------------------------

def test_after_forget_the_next_caller_does_not_wait_for_a_reading_begun_before_it() -> None:
    """A background reading hangs (a legacy table under an ALTER, a network that drops packets);
    the operator pauses the job on the page; forget(); the page the action redirects to, and every
    scrape after it, wait for the hung reading, whose books forget() would discard anyway."""
    now = [0.0]
    state = {"paused": False}
    hung, release = threading.Event(), threading.Event()
    calls = [0]

    def books(runner: int) -> dict:
        calls[0] += 1
        seen = dict(state)
        if calls[0] == 2:  # begun before the action; does not finish
            hung.set()
            release.wait(30)
        return seen

    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0])
    assert cache.get("j", 1) == {"paused": False}
    now[0] = 6.0
    cache.get("j", 1)  # starts the reading that hangs
    assert hung.wait(5)
    state["paused"] = True
    cache.forget()  # the page's pause went through
    got: dict = {}
    caller = threading.Thread(target=lambda: got.setdefault("books", cache.get("j", 1)), daemon=True)
    started = time.monotonic()
    caller.start()
    caller.join(3)
    waited = time.monotonic() - started
    try:
        assert not caller.is_alive(), f"the caller after forget() still waits after {waited:.1f} s for a reading begun before it"
        assert got["books"] == {"paused": True}
    finally:
        release.set()
        caller.join(10)


# -- 3 -------------------------------------------------------------------------------------------

def test_a_background_reading_whose_thread_cannot_start_does_not_keep_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """`threading.Thread.start` raises RuntimeError("can't start new thread") under a pids or
    memory limit. The job's lock, taken for that thread, must not stay taken."""
    now = [0.0]
    books = _Counting()
    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0], max_age=60.0)
    assert cache.get("j", 1) == {"n": 1}
    now[0] = 6.0
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", _cannot_start)
    with contextlib.suppress(RuntimeError):
        cache.get("j", 1)
    monkeypatch.setattr(threading.Thread, "start", real_start)
    now[0] = 12.0  # threads can start again
    cache.get("j", 1)
    _settle(cache)
    assert cache.get("j", 1) == {"n": 2}, "the job's books were never read again"


def test_a_first_reading_that_hangs_keeps_the_others_waiting_a_bounded_time() -> None:
    release = threading.Event()

    def hangs(runner: int) -> dict:
        release.wait(30)
        return {"ok": True}

    cache = StatusCache(hangs, fresh=5.0, wait=0.5)
    first = threading.Thread(target=_quietly, args=(cache, "j"), daemon=True)
    first.start()  # the first caller begins the reading, which hangs
    time.sleep(0.2)
    started = time.monotonic()
    with pytest.raises(StaleBooks, match="being read for the first time"):
        cache.get("j", 1)
    assert time.monotonic() - started < 5
    release.set()
    first.join(10)
    _settle(cache)  # released is not landed: the first caller no longer waits for it past `wait`
    assert cache.get("j", 1) == {"ok": True}


def _quietly(cache: StatusCache, name: str) -> None:
    with contextlib.suppress(StaleBooks):
        cache.get(name, 1)


# -- found by a second review (helper-37) ---------------------------------------------------------

# -- A: the bound on waiting for a first reading is per caller, not per reading ------------------

def test_while_first_readings_hang_a_scrape_does_not_wait_wait_seconds_per_job_every_time() -> None:
    """The first readings of three jobs hang (a database that does not answer, at start or after
    forget()). Each caller that finds no books waits the full `wait` (10 s, Prometheus's default
    scrape_timeout) however long the reading has already run: the collector asks job after job,
    so every scrape takes jobs x wait, for as long as the database hangs, and times out: every
    series of every job (healthy ones too) goes stale, and every alert flaps."""
    release = threading.Event()

    def hangs(runner: int) -> dict:
        release.wait(30)
        return {"ok": True}

    jobs = ("a", "b", "c")
    cache = StatusCache(hangs, fresh=5.0, wait=0.5)
    first = [threading.Thread(target=_quietly, args=(cache, j), daemon=True) for j in jobs]
    for t in first:
        t.start()  # the first caller of each job reads, and hangs
    try:
        time.sleep(1.0)  # every reading has run over `wait` now
        for scrape in range(2):
            started = time.monotonic()
            for j in jobs:
                with pytest.raises(StaleBooks):
                    cache.get(j, 1)
            took = time.monotonic() - started
            assert took < 0.4, (f"scrape {scrape + 1}: {took:.1f} s for three jobs whose readings have hung for over "
                                "`wait` already (jobs x wait, at every scrape)")
    finally:
        release.set()
        for t in first:
            t.join(10)


# -- B: a first reading after forget() that hangs keeps its caller without bound -----------------

def test_after_forget_with_a_database_that_hangs_the_page_does_not_hang() -> None:
    """The database hangs; the background reading has hung; the job's callers get StaleBooks at
    once. The operator pauses the job on the page: forget(); the page the action redirects to
    finds no books, makes the first reading itself, and waits for it as long as the database
    hangs (before the action it was told StaleBooks at once). The same for a scrape that comes
    first after the action: it waits past scrape_timeout, and its request thread stays."""
    now = [0.0]
    release = threading.Event()
    calls = [0]

    def books(runner: int) -> dict:
        calls[0] += 1
        if calls[0] >= 2:  # the database stops answering
            release.wait(30)
        return {"n": calls[0]}

    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0], wait=0.5)
    assert cache.get("j", 1) == {"n": 1}
    now[0] = 6.0
    cache.get("j", 1)  # the background reading, which hangs
    cache.forget()  # the page's pause went through
    got: dict = {}

    def page() -> None:
        try:
            got["books"] = cache.get("j", 1)
        except StaleBooks as e:
            got["stale"] = e

    caller = threading.Thread(target=page, daemon=True)
    started = time.monotonic()
    caller.start()
    caller.join(3)
    waited = time.monotonic() - started
    try:
        assert not caller.is_alive(), f"the page after forget() still waits after {waited:.1f} s (wait is 0.5 s)"
        assert "stale" in got
    finally:
        release.set()
        caller.join(10)


# -- C: a thread that cannot start: an error instead of good books; a reading that never lands: frozen books

def test_a_background_reading_whose_thread_cannot_start_leaves_the_caller_the_last_books(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a pids or memory limit Thread.start raises RuntimeError. The caller has good books in
    hand (expired a second ago) but gets the RuntimeError: /metrics' collector takes it for a
    database that is down (books = {"queues": []}), so a paused job reads as
    qbridge_job_state{state="running"}, loses qbridge_job_paused, and its queues' series go stale
    (the flapping the cache exists to prevent)."""
    now = [0.0]

    def books(runner: int) -> dict:
        return {"n": 1}

    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0], max_age=60.0)
    assert cache.get("j", 1) == {"n": 1}
    now[0] = 6.0
    monkeypatch.setattr(threading.Thread, "start", _cannot_start)
    assert cache.get("j", 1) == {"n": 1}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_books_whose_new_readings_never_land_turn_stale_rather_than_freeze(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading that ends without books (a thread that cannot start, a BaseException in the
    reading: the docstring of _land's own cases) leaves no flight, so no reading ever 'runs longer
    than max_age': if every reading ends so, the last books are served for ever as current (or, for
    a thread that cannot start, an error is). They must turn StaleBooks as a hung reading's do."""
    now = [0.0]
    calls = [0]

    def books(runner: int) -> dict:
        calls[0] += 1
        if calls[0] >= 2:
            raise SystemExit("a reading that never finishes with books")  # not an Exception: not kept
        return {"n": calls[0]}

    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0], max_age=60.0)
    assert cache.get("j", 1) == {"n": 1}
    got = []
    for t in range(6, 300, 15):  # a scrape every 15 s for five minutes
        now[0] = float(t)
        try:
            got.append(cache.get("j", 1))
        except StaleBooks:
            got.append("stale")
        _settle(cache)
    assert calls[0] > 10  # a reading was begun again and again
    assert got[-1] == "stale", f"after {now[0]:.0f} s with no reading landed the books are still served: {got[-1]}"
    assert got[0] == {"n": 1}  # not stale at once


def test_a_thread_that_never_starts_makes_the_books_stale_in_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    cache = StatusCache(lambda runner: {"n": 1}, fresh=5.0, clock=lambda: now[0], max_age=60.0)
    assert cache.get("j", 1) == {"n": 1}
    monkeypatch.setattr(threading.Thread, "start", _cannot_start)
    with pytest.raises(StaleBooks):
        for t in range(6, 300, 15):
            now[0] = float(t)
            cache.get("j", 1)


# -- D: forget() after an action on one job makes the next scrape read every job's books itself --

def test_an_action_on_one_job_does_not_make_the_next_scrape_read_the_other_jobs_books() -> None:
    """forget() empties the books of every job; the page's action names one. The next caller of
    every other job (a scrape, as often as not) finds no books and reads them itself: a scrape
    after any action waits for every job's reading (30 s each for a large BizTalk store), times
    out, and every series goes stale. Only the job the action changed needs reading afresh."""
    now = [0.0]
    reads: list[str] = []
    slow_b = threading.Event()

    def books(runner: str) -> dict:
        reads.append(runner)
        if runner == "b" and slow_b.is_set():
            time.sleep(2)  # a large store: its keys take a while to walk
        return {"job": runner, "read": len(reads)}

    cache = StatusCache(books, fresh=5.0, clock=lambda: now[0])
    assert cache.get("a", "a")["job"] == "a" and cache.get("b", "b")["job"] == "b"
    now[0] = 1.0  # both fresh
    slow_b.set()
    cache.forget("a")  # the page paused job a
    started = time.monotonic()
    assert cache.get("b", "b") == {"job": "b", "read": 2}  # a scrape: b's books as they were
    assert time.monotonic() - started < 1, "a scrape after an action on job a waited for job b's books"
    assert reads == ["a", "b"], "job b's fresh books were thrown away by an action on job a"
    assert cache.get("a", "a") == {"job": "a", "read": 3}  # job a: afresh, at once
