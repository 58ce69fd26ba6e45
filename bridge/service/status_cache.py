"""`status()` for the listener of `qbridge run`, shared by `/metrics`, `/` and `/status.json`.

`status()` counts the ledger and, for scan sources, walks every pending key: on a store with
millions of handles that takes seconds. A Prometheus scrape every 15 s, a page reloading every
10 s and a few people looking at it must not each start that work, nor pile up behind one
another. So each job's books are computed by one caller at a time, at most once per `fresh`
seconds, or per four times as long as the last computation took (a job whose books take 30 s
to read is read every 2 minutes, not continuously); while that runs, everyone else gets the
last finished result at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

FRESH_SECONDS = 5.0


class StatusCache:
    def __init__(self, compute: Callable[[Any], dict[str, Any]], fresh: float = FRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.compute = compute
        self.fresh = fresh
        self.clock = clock
        self._books: dict[str, tuple[float, dict[str, Any]]] = {}  # when it expires, the books
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._generation = 0  # forget() raises it: books begun before are not kept

    def forget(self) -> None:
        """After an operator's action (a pause on the page): the next reader computes the books
        afresh, so the page it is sent to shows the state the action produced, not one 5 s old."""
        with self._guard:
            self._generation += 1
            self._books.clear()

    def get(self, name: str, runner: Any) -> dict[str, Any]:
        """The job's books, at most `fresh` seconds old unless a newer computation is under way.
        A failure is raised to the caller that ran the computation and is not kept."""
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        have = self._books.get(name)
        if have is not None and self.clock() < have[0]:
            return have[1]
        if not lock.acquire(blocking=have is None):
            assert have is not None  # only a non-blocking acquire fails, and it is one only with books in hand
            return have[1]  # someone is computing newer books; these are the last finished ones
        try:
            again = self._books.get(name)
            if again is not None and again is not have and self.clock() < again[0]:
                return again[1]  # computed while this caller waited for the lock
            started, generation = self.clock(), self._generation
            books = self.compute(runner)
            done = self.clock()
            if generation == self._generation:  # else an action came meanwhile: these books may predate it
                self._books[name] = (done + max(self.fresh, 4 * (done - started)), books)
            return books
        finally:
            lock.release()
