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

Books are not served stale for ever: once a reading has run longer than `max_age` (a minute, or
eight times the last reading's duration) without finishing (a database that hangs), callers get
StaleBooks, which names how old the last books are, instead of figures that froze. Books that
are old only because nobody asked (a scrape a minute) are not stale: the caller that finds them
expired starts the next reading. A caller that finds no books waits at most `wait` seconds for
the reading under way. A reading that fails is kept as that failure for `fresh` seconds (a
database that is down is not asked again by every scrape) and raised to every caller meanwhile.
After `forget()` the next caller reads anew at once, whatever reading began before (its books are
not kept, and nobody waits for it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FRESH_SECONDS = 5.0
MAX_AGE_SECONDS = 60.0
WAIT_SECONDS = 10.0  # Prometheus's default scrape_timeout


class StaleBooks(RuntimeError):
    """The last finished books are too old to show, and reading new ones has not finished."""


@dataclass(frozen=True)
class _Reading:
    expires: float  # when a caller starts a new reading
    done: float  # when this one finished
    took: float  # seconds it took
    books: dict[str, Any] | None
    error: BaseException | None = None


@dataclass
class _Flight:
    """A reading under way: at most one a job, begun by a caller."""

    began: float
    landed: threading.Event = field(default_factory=threading.Event)
    reading: _Reading | None = None  # set before `landed`: for the callers that waited for it


class StatusCache:
    def __init__(self, compute: Callable[[Any], dict[str, Any]], fresh: float = FRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic, max_age: float = MAX_AGE_SECONDS,
                 wait: float = WAIT_SECONDS) -> None:
        self.compute = compute
        self.fresh = fresh
        self.clock = clock
        self.max_age = max_age
        self.wait = wait
        self._readings: dict[str, _Reading] = {}
        self._flights: dict[str, _Flight] = {}
        self._guard = threading.Lock()

    def forget(self) -> None:
        """After an operator's action (a pause on the page): the next reader computes the books
        afresh, so the page it is sent to shows the state the action produced, not one 5 s old.
        A reading under way lands unkept (it may predate the action)."""
        with self._guard:
            self._readings.clear()
            self._flights.clear()

    def get(self, name: str, runner: Any) -> dict[str, Any]:
        """The job's books: read now if there are none yet, else the last finished ones (a new
        reading started in the background once they expire)."""
        with self._guard:
            have, flight = self._readings.get(name), self._flights.get(name)
            mine = None
            if flight is None and (have is None or self.clock() >= have.expires):
                mine = flight = self._flights[name] = _Flight(self.clock())
        if have is None:  # the first reading: this caller's, or one under way
            assert flight is not None  # with no books, this caller began one if none was under way
            if mine is not None:
                self._fly(name, runner, mine)
            elif not flight.landed.wait(self.wait):
                raise StaleBooks(f"the job's books are being read for the first time, for {self.clock() - flight.began:.0f} s "
                                 "so far (a database that does not answer?)")
            assert flight.reading is not None  # every flight lands with a reading
            return self._give(flight.reading, None)
        if mine is not None:
            try:
                threading.Thread(target=self._fly, args=(name, runner, mine), daemon=True, name=f"qbridge-books-{name}").start()
            except BaseException:  # can't start new thread: land it, or no reading would ever begin again
                self._land(name, mine, None)
                raise
        return self._give(have, flight)

    def _give(self, reading: _Reading, flight: _Flight | None) -> dict[str, Any]:
        if flight is not None and self.clock() - flight.began > max(self.max_age, 8 * reading.took):
            raise StaleBooks(f"the job's books were last read {self.clock() - reading.done:.0f} s ago, and reading them "
                             f"again has not finished in {self.clock() - flight.began:.0f} s (a database that does not answer?)")
        if reading.error is not None:
            raise reading.error.with_traceback(None)  # raised again and again: its traceback must not grow
        assert reading.books is not None
        return reading.books

    def _fly(self, name: str, runner: Any, flight: _Flight) -> None:
        reading = None
        try:
            reading = self._read(runner)
        finally:
            self._land(name, flight, reading)

    def _land(self, name: str, flight: _Flight, reading: _Reading | None) -> None:
        """`reading` None: it never finished (a thread that did not start, a BaseException); the
        last books stay, and the next caller begins another."""
        with self._guard:
            if self._flights.get(name) is flight:  # else forget() came meanwhile: these books may predate it
                del self._flights[name]
                if reading is not None:
                    self._readings[name] = reading
        if reading is None:  # for the callers that waited for it
            now = self.clock()
            reading = _Reading(now, now, 0.0, None, StaleBooks("the job's books could not be read"))
        flight.reading = reading
        flight.landed.set()

    def _read(self, runner: Any) -> _Reading:
        started = self.clock()
        try:
            books, error = self.compute(runner), None
        except Exception as e:  # noqa: BLE001 - kept, and raised to every caller until the next reading
            books, error = None, e
        done = self.clock()
        took = done - started
        return _Reading(done + (self.fresh if error else max(self.fresh, 4 * took)), done, took, books, error)
