"""What a pass, a batch or a Spark unit did: counts, where its time went, the gaps it left."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from bridge.ledger.gaps import Gap

log = logging.getLogger("qbridge.migrate")

SCAN_CHUNK = 10_000  # keys a scan pass (or verify) holds at once
# New keys a walk that goes by no age keeps for its drain's next passes (Passes._scan): a walk
# each SCAN_RESERVE keys delivered, in place of one each batch: about 5 MB held, twice that
# while a walk sorts them.
SCAN_RESERVE = 20_000
# Reserves a drain refills in age order between two walks from the first key: a handle older than
# the reserve (committed late, given back) waits at most this many reserves and one, inflow or not.
REFILLS_A_WALK = 4


def chunked(items: Any, size: int = SCAN_CHUNK) -> Any:
    """Lists of up to `size` items from an iterable, streamed."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def key_chunks(keys: Any) -> Any:
    """Keys as the ledger holds them (text), in lists of SCAN_CHUNK: a walk over every key of a
    queue streams, whatever the size (verify, status and the backlog count)."""
    return chunked(str(k) for k in keys)



@dataclass
class PassStats:
    queue: str
    read: int = 0
    delivered: int = 0
    skipped: int = 0
    quarantined: int = 0
    already: int = 0  # found in the ledger: delivered by an earlier pass or process
    consumed: int = 0
    gaps_open: int = 0
    gaps_given_up: list[Gap] = field(default_factory=list)
    more: bool = False  # the batch was full: more rows wait
    lag_seconds: float | None = None
    seconds: float = 0.0
    # where the seconds went: reading the source, decoding and mapping in Python, writing and committing
    t_read: float = 0.0
    t_map: float = 0.0
    t_write: float = 0.0
    waiting: str | None = None  # why the drain stopped before the queue was drained: paused or held

    def add(self, other: PassStats) -> None:
        for name in ("read", "delivered", "skipped", "quarantined", "already", "consumed", "seconds", "t_read", "t_map", "t_write"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.gaps_open = other.gaps_open
        self.gaps_given_up.extend(other.gaps_given_up)
        if other.lag_seconds is not None:
            self.lag_seconds = other.lag_seconds
        if other.waiting is not None:
            self.waiting = other.waiting



@dataclass
class RangeResult:
    """What one range or key list did, and the ids in it no row had (gaps to keep watching)."""

    stats: PassStats
    gaps: list[Gap] = field(default_factory=list)


def summary_table(totals: list[PassStats]) -> Table:
    """What `sync --once` and `migrate` print at the end, a row per job and queue."""
    t = Table(title="qbridge summary")
    for col in ("job/queue", "read", "delivered", "skipped", "quarantined", "already there", "consumed", "open gaps", "rows/s"):
        t.add_column(col, justify="left" if col == "job/queue" else "right")
    for s in totals:
        rate = f"{s.read / s.seconds:,.0f}" if s.seconds > 0 else "-"
        t.add_row(s.queue, str(s.read), str(s.delivered), str(s.skipped), str(s.quarantined), str(s.already),
                  str(s.consumed), str(s.gaps_open), rate)
    return t


def where_the_time_went(jvm: float, planned: float, total: float, totals: list[PassStats], slots: int) -> None:
    """One line: JVM start and planning (overlapped), then the units' time split by what the
    tasks did (summed over tasks, so it can exceed the wall time on several slots)."""
    read = sum(t.t_read for t in totals)
    python = sum(t.t_map for t in totals)
    write = sum(t.t_write for t in totals)
    log.info("where the time went: %.1fs in all; JVM start %.1fs with checks and planning alongside (ready to run "
             "at %.1fs); then on %s task slots: source reads %.1fs, Python decode+map %.1fs, target writes+commits "
             "%.1fs (summed over tasks)", total, jvm, planned, slots, read, python, write)
