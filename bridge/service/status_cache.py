"""`status()` for the listener of `qbridge run`, shared by `/metrics`, `/` and `/status.json`.

`status()` counts the ledger and, for scan sources, walks every pending key: on a store with
millions of handles that takes seconds. A Prometheus scrape every 15 s, a page reloading every
10 s and a few people looking at it must not each start that work, nor pile up behind one
another. So each job's books are computed by one thread at a time, at most once per `fresh`
seconds, or per four times as long as the last computation took (a job whose books take 30 s
to read is read every 2 minutes, not continuously).

Every reading is made in the background. A caller that finds no books (the first time, and the
first time after `forget()`) waits for the reading under way, but only until it has run `wait`
seconds: not `wait` seconds a caller (a scrape asks job after job; one that waited 10 s a job
whose first reading hangs would time out at every scrape), nor for ever (a database that hangs
kept the page an action redirects to waiting as long as it hung). After that, a caller that
finds the books expired starts a new reading in the background and gets the last finished books
at once. A scrape must never wait for the books: Prometheus gives up on a scrape after its
scrape_timeout (10 s by default, at most the scrape interval), and a failed scrape makes every series of the target stale, so each alert resolves and must wait out
its whole `for:` again; with books that take longer than the timeout, QBridgeLagHigh (`for: 5m`)
would never fire (CI of 2026-11-29: a 1 s scrape that computed the books timed out, and the
alert test's alerts flapped).

Books are not served stale for ever: once a reading has run longer than `max_age` (a minute, or
eight times the last reading's duration) without finishing (a database that hangs), callers get
StaleBooks, which names how old the last books are, instead of figures that froze. Readings that
end without books (a thread that cannot start, a BaseException) count as one that has not
finished, from the first of them: they do not make the last books current for ever. Books that
are old only because nobody asked (a scrape a minute) are not stale: the caller that finds them
expired starts the next reading. A reading that fails is kept as that failure for `fresh` seconds (a
database that is down is not asked again by every scrape) and raised to every caller meanwhile.
After `forget(name)` the job's next caller reads anew at once, whatever reading began before
(its books are not kept, and nobody waits for it); the other jobs' books stay (a scrape after an
action on one job must not read every job's books).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

FRESH_SECONDS = 5.0
MAX_AGE_SECONDS = 60.0
WAIT_SECONDS = 5.0  # half Prometheus's default scrape_timeout: a scrape that waited it all would fail anyway


class StaleBooks(RuntimeError):
    """The last finished books are too old to show, and reading new ones has not finished."""


@dataclass(frozen=True)
class _Reading:
    expires: float  # when a caller starts a new reading
    done: float  # when this one finished
    took: float  # seconds it took
    books: dict[str, Any] | None
    error: BaseException | None = None
    retrying: float | None = None  # since when readings begun after this one ended without books


@dataclass
class _Flight:
    """A reading under way: at most one a job, begun by a caller."""

    began: float
    started: float = field(default_factory=time.monotonic)  # for `wait`, which Event.wait counts in real time
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

    def forget(self, name: str | None = None) -> None:
        """After an operator's action on job `name` (a pause on the page; None: every job): its
        next reader computes the books afresh, so the page it is sent to shows the state the
        action produced, not one 5 s old. A reading under way lands unkept (it may predate the
        action)."""
        with self._guard:
            for cleared in (self._readings, self._flights):
                if name is None:
                    cleared.clear()
                else:
                    cleared.pop(name, None)

    def get(self, name: str, runner: Any) -> dict[str, Any]:
        """The job's books: the last finished ones (a new reading started in the background once
        they expire), or, if there are none yet, those of the reading under way once it lands,
        waiting until it has run at most `wait` seconds."""
        with self._guard:
            have, flight = self._readings.get(name), self._flights.get(name)
            mine = None
            if flight is None and (have is None or self.clock() >= have.expires):
                mine = flight = self._flights[name] = _Flight(self.clock())
        if mine is not None:
            try:
                threading.Thread(target=self._fly, args=(name, runner, mine), daemon=True, name=f"qbridge-books-{name}").start()
            except BaseException:  # can't start new thread: land it, or no reading would ever begin again
                self._land(name, mine, None)
                if have is None:
                    raise
                return self._give(have, _since(have, mine))
        if have is None:  # the first reading: one under way (this caller's, or another's)
            assert flight is not None  # with no books, this caller began one if none was under way
            if not flight.landed.wait(max(0.0, self.wait - (time.monotonic() - flight.started))):
                raise StaleBooks(f"the job's books are being read for the first time, for {self.clock() - flight.began:.0f} s "
                                 "so far (a database that does not answer?)")
            assert flight.reading is not None  # every flight lands with a reading
            return self._give(flight.reading, None)
        return self._give(have, _since(have, flight))

    def _give(self, reading: _Reading, since: float | None) -> dict[str, Any]:
        """`since`: when the reading under way (or the first of those that ended without books) began."""
        if since is not None and self.clock() - since > max(self.max_age, 8 * reading.took):
            raise StaleBooks(f"the job's books were last read {self.clock() - reading.done:.0f} s ago, and reading them "
                             f"again has not finished in {self.clock() - since:.0f} s (a database that does not answer?)")
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
        last books stay, marked as being re-read since the first such reading began (they turn
        stale as a hung reading's do), and the next caller begins another."""
        with self._guard:
            if self._flights.get(name) is flight:  # else forget() came meanwhile: these books may predate it
                del self._flights[name]
                if reading is not None:
                    self._readings[name] = reading
                elif (have := self._readings.get(name)) is not None and have.retrying is None:
                    self._readings[name] = replace(have, retrying=flight.began)
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


def _since(have: _Reading, flight: _Flight | None) -> float | None:
    """Since when the books have been being read again: the first reading that ended without
    books, else the one under way (None: none)."""
    return have.retrying if have.retrying is not None else flight.began if flight is not None else None
