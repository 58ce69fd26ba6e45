"""`status()` for the listener of `qbridge run`, shared by `/metrics`, `/` and `/status.json`.

`status()` counts the ledger and, for scan sources, walks every pending key: on a store with
millions of handles that takes seconds. A Prometheus scrape every 15 s, a page reloading every
10 s and a few people looking at it must not each start that work, nor pile up behind one
another. So each job's books are computed by one thread at a time, at most once per `fresh`
seconds, or per four times as long as the last computation took (a job whose books take 30 s
to read is read every 2 minutes, not continuously).

Only the first reading of a job's books (and the first after `forget()`) is made by the caller
that asks. After that, a caller that finds them expired starts a new reading in the background
and gets the last finished books at once. A scrape must never wait for the books: Prometheus
gives up on a scrape after its scrape_timeout (10 s by default, at most the scrape interval), and
a failed scrape makes every series of the target stale, so each alert resolves and must wait out
its whole `for:` again; with books that take longer than the timeout, QBridgeLagHigh (`for: 5m`)
would never fire (CI of 2026-11-29: a 1 s scrape that computed the books timed out, and the
alert test's alerts flapped).

Books are not served stale for ever: once the last finished ones are older than `max_age`
(a minute, or eight times their reading's duration) while a new reading still runs (a database
that hangs), callers get StaleBooks, which names how old they are, instead of figures that froze.
A reading that fails is kept as that failure for `fresh` seconds (a database that is down is not
asked again by every scrape) and raised to every caller meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FRESH_SECONDS = 5.0
MAX_AGE_SECONDS = 60.0


class StaleBooks(RuntimeError):
    """The last finished books are too old to show, and reading new ones has not finished."""


@dataclass(frozen=True)
class _Reading:
    expires: float  # when a caller starts a new reading
    done: float  # when this one finished
    took: float  # seconds it took
    books: dict[str, Any] | None
    error: BaseException | None = None


class StatusCache:
    def __init__(self, compute: Callable[[Any], dict[str, Any]], fresh: float = FRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic, max_age: float = MAX_AGE_SECONDS) -> None:
        self.compute = compute
        self.fresh = fresh
        self.clock = clock
        self.max_age = max_age
        self._readings: dict[str, _Reading] = {}
        self._locks: dict[str, threading.Lock] = {}  # held by whoever is reading the job's books
        self._guard = threading.Lock()
        self._generation = 0  # forget() raises it: books begun before are not kept

    def forget(self) -> None:
        """After an operator's action (a pause on the page): the next reader computes the books
        afresh, so the page it is sent to shows the state the action produced, not one 5 s old."""
        with self._guard:
            self._generation += 1
            self._readings.clear()

    def get(self, name: str, runner: Any) -> dict[str, Any]:
        """The job's books: read now if there are none yet, else the last finished ones (a new
        reading started in the background once they expire)."""
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        have = self._readings.get(name)
        if have is None:
            with lock:  # the first reading: everyone waits for it, and only one reads
                have = self._readings.get(name)
                if have is None:
                    have = self._read(name, runner)
            return self._give(have)
        if self.clock() >= have.expires and lock.acquire(blocking=False):
            threading.Thread(target=self._read_then_release, args=(name, runner, lock), daemon=True,
                             name=f"qbridge-books-{name}").start()
        return self._give(have)

    def _give(self, reading: _Reading) -> dict[str, Any]:
        if reading.error is not None:
            raise reading.error.with_traceback(None)  # raised again and again: its traceback must not grow
        age = self.clock() - reading.done
        if age > max(self.max_age, 8 * reading.took):
            raise StaleBooks(f"the job's books were last read {age:.0f} s ago, and reading them again has not "
                             "finished (a database that does not answer?)")
        assert reading.books is not None
        return reading.books

    def _read_then_release(self, name: str, runner: Any, lock: threading.Lock) -> None:
        try:
            self._read(name, runner)
        finally:
            lock.release()

    def _read(self, name: str, runner: Any) -> _Reading:
        started, generation = self.clock(), self._generation
        try:
            books, error = self.compute(runner), None
        except Exception as e:  # noqa: BLE001 - kept, and raised to every caller until the next reading
            books, error = None, e
        done = self.clock()
        took = done - started
        reading = _Reading(done + (self.fresh if error else max(self.fresh, 4 * took)), done, took, books, error)
        with self._guard:
            if generation == self._generation:  # else an action came meanwhile: these books may predate it
                self._readings[name] = reading
        return reading
