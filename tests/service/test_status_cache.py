"""The listener's shared reading of a job's books (bridge.service.status_cache): read at most once
per interval, never by a scrape once there are books (a scrape that waits past Prometheus's
scrape_timeout makes every series stale and every alert flap), never stale for ever, and a
failure shown rather than hidden."""

from __future__ import annotations

import threading
import time

import pytest

from bridge.service.status_cache import StaleBooks, StatusCache


def _settle(cache: StatusCache, name: str = "j") -> None:
    """Until no reading of the job runs in the background."""
    lock = cache._locks[name]
    deadline = time.monotonic() + 10
    while not lock.acquire(timeout=0.05):
        assert time.monotonic() < deadline, "the background reading never finished"
    lock.release()


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
    now[0] = 59.0
    assert cache.get("j", 1) == {"lag": 1}
    now[0] = 61.0
    with pytest.raises(StaleBooks, match=r"last read 61 s ago"):
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
