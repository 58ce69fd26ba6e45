"""The next batch of a draining queue, read while this pass's target write commits (issue 49).

A pass is serial: the database works (the read, the COPY, the commit) while Python waits, then
Python works while the database waits. On a monotonic queue in copy mode the next pass's read is
known as soon as this pass has read its batch: the rows after its last key. A read-ahead makes
that read on a connection of its own, in a thread, and the next pass takes it in place of its own
read when its checkpoint (read under its lock) still ends at that key and its batch size is the
same; anything else and the pass reads as before.

Why that read is the pass's own: copy mode reads with no lock, each statement in a snapshot of its
own (READ COMMITTED), so the read-ahead is the statement the pass would make, made a moment
earlier. A row that commits after it, below the batch's last key, is a gap the next pass reads as a
late row, as one that commits just after the pass's own read is. Move mode (whose read holds its
rows locked in the pass's source transaction) and SQLite (one writer, and a read-only copy-mode
source gains nothing there) never read ahead, nor does a process with QBRIDGE_READ_AHEAD=0 (the
benchmarks' reference run, bench/migrate.py's (r)).

A scan source's drain in copy mode whose walk goes oldest first (BizTalk) knows where its next
batch starts too: after this batch's last key in the walk's order. Its read-ahead walks the next
batch's keys and fetches their rows; the next pass still walks and looks its keys up in the
ledger under its lock, and takes the rows only when its batch is exactly the keys read ahead. An
entry taken so was there at the read-ahead's fetch and at the pass's walk, as one the pass
fetches itself is there at its walk and its fetch: either way it was there when the pass walked,
and its message (Spool, context, parts) does not change while the entry lives. Not OpenJMS's
reserve, whose passes do not walk (`next_batch`).

Not in Spark's units: there every core is busy already (a unit per task slot), and a read-ahead
a unit made it slower (docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from bridge.pipeline.arrow_reads import ArrowReads
from bridge.pipeline.lane_imports import import_lane_modules
from bridge.sources import Source

log = logging.getLogger("qbridge.batch")
NOT_MADE: Any = object()  # no columns were made ahead for these rows
# How long a pass (or a drain's end) waits for a read-ahead before it leaves it to finish alone
# and reads itself: far above a batch's read, so only a read-ahead stuck on its connection meets it.
STUCK_SECONDS = 60.0


@dataclass
class Ahead:
    """One read-ahead: the rows of what a pass asks for (`want`), once `done` is set."""

    want: Any  # (after, limit) of a monotonic read; a scan's batch keys, once read (None before)
    done: threading.Event = field(default_factory=threading.Event)
    read: threading.Event = field(default_factory=threading.Event)  # its rows are read, its connection let go
    go: threading.Event = field(default_factory=threading.Event)  # the pass is writing: make the columns now
    rows: Any = None
    columns: Any = NOT_MADE  # the columnar lane's columns of every row (pipeline/columnar.ahead_columns), made ahead too
    error: BaseException | None = None
    cancelled: bool = False  # no pass will take it: its columns are not begun (or, begun, dropped)

    def finish(self, queue: str) -> bool:
        """Waits for the read-ahead to end, or, cancelled, for its connection to be let go (columns
        it is making then are made in vain, and dropped); False when it is stuck."""
        self.go.set()
        if (self.read if self.cancelled else self.done).wait(STUCK_SECONDS):
            return True
        self.stuck(queue)
        return False

    def stuck(self, queue: str) -> None:
        log.warning("queue=%s: a read-ahead has not ended in %.0f s (its legacy connection stuck?); the pass reads "
                    "itself and the read-ahead's rows, when they come, are dropped", queue, STUCK_SECONDS)


class ReadAhead:
    """The read-aheads of one runner, one a queue at most."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.on = engine.dialect.name != "sqlite" and os.environ.get("QBRIDGE_READ_AHEAD") != "0"
        self._ahead: dict[str, Ahead] = {}
        self.draining: set[str] = set()  # queues a drain is passing over: only its next pass takes a read-ahead
        self._columns: dict[str, tuple[Any, Any]] = {}  # a taken read-ahead's (rows, columns made ahead)
        self.arrow = ArrowReads(engine)  # a monotonic PostgreSQL queue's reads, by ADBC
        self.taken = 0  # read-aheads a pass took, and batches whose lane took columns made ahead (tests count them)
        self.columns_taken = 0

    def start(self, source: Source, after: int, limit: int, columns: Callable[[Any], Any] | None = None) -> None:
        """Reads a monotonic `source`'s next `limit` rows after `after` in a thread, when a drain
        passes over its queue (one a queue: an earlier one not taken is dropped); `columns(rows)`,
        when given, makes the lane's columns of them there too (NOT_MADE where it makes none)."""
        if source.cursor == "monotonic":
            self._start(source, (after, limit), lambda: ((after, limit), self._after(source, after, limit)), columns, False)

    def _after(self, source: Source, after: int, limit: int) -> Any:
        rows = self.arrow.read_after(source, after, limit)
        return rows if rows is not None else self._on_connection(lambda conn: source.fetch_after(conn, after, limit, False))

    def _on_connection(self, read: Callable[[sa.Connection], Any]) -> Any:
        with self.engine.connect() as conn, conn.begin():
            return read(conn)

    def start_keys(self, source: Source, keys: Callable[[sa.Connection], list[Any]]) -> None:
        """Fetches the rows of a scan `source`'s next batch in a thread, as `start` reads a
        monotonic one's: `keys(conn)` says which (the walk on). Rows only: a BizTalk drain
        whose read-ahead made the lane's columns too, beside the pass's write, was no faster and
        spent a fifth more Python (docs/benchmarks.md)."""
        if source.cursor == "scan":
            self._start(source, None, lambda: self._on_connection(lambda conn: _keyed(source, conn, keys(conn))), None, True)

    def _start(self, source: Source, want: Any, read_rows: Callable[[], tuple[Any, Any]],
               columns: Callable[[Any], Any] | None, at_write: bool) -> None:
        if not self.on or source.queue not in self.draining:
            return
        self._stop(source.queue)
        if not at_write:  # a monotonic read-ahead reads by ADBC into Arrow, and makes the lane's columns
            import_lane_modules()
        ahead = Ahead(want)

        def read() -> None:
            try:
                if at_write:
                    # A scan's fetch is mostly Python's work (its rows made into dicts): begun beside
                    # the pass's own decoding it only takes turns with it; beside the write it overlaps.
                    ahead.go.wait()
                if not ahead.cancelled:
                    ahead.want, ahead.rows = read_rows()
                ahead.read.set()
                if columns is not None:
                    # Made while the pass's write waits on the database, not beside its own lane
                    # (both are Python's work: side by side they only take turns).
                    ahead.go.wait()
                    try:
                        if not ahead.cancelled:
                            ahead.columns = columns(ahead.rows)
                    except Exception:  # noqa: BLE001 - the lane makes them again, and says what went wrong
                        ahead.columns = NOT_MADE
            except BaseException as e:  # noqa: BLE001 - the pass reads again itself, and meets the error there
                ahead.error = e
            finally:
                ahead.read.set()
                ahead.done.set()

        try:
            threading.Thread(target=read, name=f"qbridge-read-ahead-{source.queue}", daemon=True).start()
        except RuntimeError as e:  # no thread to be had (a process limit): the passes read themselves
            log.warning("queue=%s: no read-ahead (%s); the next pass reads itself", source.queue, e)
            return
        self._ahead[source.queue] = ahead

    def take(self, queue: str, want: Any) -> Any:
        """The rows read ahead for a pass asking for `want` ((after, limit) of a monotonic read, a
        scan's batch keys), or None (the pass reads them itself): none was started, it was for
        another key, size or batch, or it failed."""
        ahead = self._ahead.pop(queue, None)
        if ahead is None:
            return None
        if ahead.want is None:  # a scan's keys: known once read
            ahead.go.set()  # its read waits for a write that may not have come (a pass that failed)
            if not ahead.read.wait(STUCK_SECONDS):
                ahead.cancelled = True  # its thread, when it comes back, makes no columns and ends
                ahead.stuck(queue)
                self.arrow.forget(queue)
                return None
        if ahead.want != want:
            ahead.cancelled = True
            self._finish(ahead, queue)
            return None
        if not self._finish(ahead, queue):
            return None
        if ahead.error is not None:
            log.debug("queue=%s: the read-ahead failed (%s); the pass reads itself", queue, ahead.error)
            return None
        self.taken += 1
        if ahead.columns is not NOT_MADE:
            self._columns[queue] = (ahead.rows, ahead.columns)
        return ahead.rows

    def columns(self, queue: str, rows: Any) -> Any:
        """The lane's columns of every row of `rows`, made ahead with them (columnar.ahead_columns), or NOT_MADE."""
        made = self._columns.pop(queue, None)
        if made is None or made[0] is not rows:
            return NOT_MADE
        self.columns_taken += 1
        return made[1]

    def drop(self, queue: str) -> None:
        """Forgets `queue`'s read-ahead, once its thread has let go of its connection, and closes
        the queue's ADBC connection (its drain ends)."""
        self._columns.pop(queue, None)
        self._stop(queue)
        self.arrow.close(queue)

    def _finish(self, ahead: Ahead, queue: str) -> bool:
        if ahead.finish(queue):
            return True
        self.arrow.forget(queue)  # the stuck read-ahead keeps its connection
        return False

    def _stop(self, queue: str) -> None:
        """Forgets a read-ahead not taken (the columns of one taken are kept for its batch)."""
        ahead = self._ahead.pop(queue, None)
        if ahead is not None:
            ahead.cancelled = True
            self._finish(ahead, queue)

    def writing(self, queue: str) -> None:
        """The pass of `queue` is writing its batch: its read-ahead makes its columns now."""
        ahead = self._ahead.get(queue)
        if ahead is not None:
            ahead.go.set()


def _keyed(source: Source, conn: sa.Connection, keys: list[Any]) -> tuple[list[Any], Any]:
    """A scan's batch keys read ahead, and their rows."""
    return keys, source.fetch_keys(conn, keys, False)


def next_batch(source: Source, walk_end: Any, size: int) -> Callable[[sa.Connection], list[Any]] | None:
    """The keys a scan drain's next pass takes when nothing moves meanwhile, where its walk goes
    oldest first: the `size` after this batch's last in the walk's order (`walk_end`); None where
    the next pass walks anew (the walk found the end).

    Only there: that pass walks its keys after the read-ahead began, so an entry the legacy side
    removed meanwhile is missing from its batch, which then is not the one read ahead. A pass that
    takes its batch from a reserve (OpenJMS) looks at the store again only in its own fetch: rows
    fetched ahead would deliver a handle acknowledged since, with the redelivered flag it had then
    (tests/review/test_scan_read_ahead_review.py)."""
    if not source.walks_oldest_first or walk_end is None:
        return None

    def walked(conn: sa.Connection) -> list[Any]:
        walk = source.iter_aged(conn, walk_end, size + 1)  # the page the next pass's walk reads
        try:
            return [k for k, _ in itertools.islice(walk, size)]
        finally:
            close = getattr(walk, "close", None)
            if close:
                close()
    return walked
