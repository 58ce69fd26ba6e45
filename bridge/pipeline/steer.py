"""What a job's batches wait for (issue 38): a rate cap (`max_rate`) and back-pressure from the
destination queues (`max_target_depth`). An operator's pause is read from the target database
(bridge.ledger.steering); both of these are judged by the process running the batches."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import datetime

import sqlalchemy as sa

from bridge.timefmt import naive_utc, utcnow

log = logging.getLogger("qbridge.steer")


class Pace:
    """`max_rate` held across batches and schedules: a batch of n messages moves the earliest
    start of the next one n/rate seconds on. Time spent idle earns no credit, so a batch never
    overshoots the rate after a quiet hour; batches are cut to a second's worth of messages
    (rate_batch), so no burst is longer than that."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self.clock, self.sleep = clock, sleep
        self.next_at = 0.0
        self.waited = 0.0  # seconds waited in all

    def wait(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Until the rate allows the next batch (in slices, so that a stop is heard)."""
        if not self.rate:
            return
        while not should_stop():
            delay = self.next_at - self.clock()
            if delay <= 0:
                return
            step = min(delay, 0.5)
            self.sleep(step)
            self.waited += step

    def spent(self, messages: int) -> None:
        if self.rate and messages:
            self.next_at = max(self.next_at, self.clock()) + messages / self.rate


def rate_batch(batch_size: int, rate: float | None) -> int:
    """The batch size a rate allows: at most a second's worth of messages, at least one."""
    return batch_size if not rate else max(1, min(batch_size, math.floor(rate)))


class Pressure:
    """Back-pressure: holds the job while a destination queue holds its limit of rows (or so
    nearly that less than a tenth of a batch fits), until every one is below `resume_percent` of
    its limit; a pass's batch is cut to the room left. A queue's depth is counted up to
    twice its limit (`SELECT count(*) FROM (SELECT 1 ... LIMIT 2n+1)`): exact where it matters,
    never an estimate that could err on the unsafe side, and never more than 2n+1 rows read,
    however deep the queue is."""

    def __init__(self, engine: sa.Engine, limits: dict[str, tuple[sa.Table, int]], resume_percent: int,
                 batch_size: int = 1000) -> None:
        self.engine = engine
        self.limits = limits  # queue -> (its table, the most rows it may hold)
        self.resume_percent = resume_percent
        # Near its limit a queue holds the job too: batches cut to a sliver of room would trickle
        # in one by one (a pass each) as the endpoint takes rows; held, it resumes with room for
        # at least a tenth of a batch.
        self.least_room = {q: max(1, min(batch_size, limit) // 10) for q, (_, limit) in limits.items()}
        self.held: str | None = None  # why the job is held now
        self.since: float | None = None  # monotonic time the hold began
        self.deepest: dict[str, int] = {}  # queue -> most rows seen (as counted: at most 2 limit + 1)
        self.last: dict[str, int] = {}  # queue -> rows at the last look

    def depths(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.engine.connect() as conn:
            for queue, (table, limit) in self.limits.items():
                capped = sa.select(sa.literal(1)).select_from(table).limit(2 * limit + 1).subquery()
                out[queue] = int(conn.execute(sa.select(sa.func.count()).select_from(capped)).scalar_one())
                self.deepest[queue] = max(self.deepest.get(queue, 0), out[queue])
        self.last = out
        return out

    def room(self) -> int | None:
        """Rows the next batch may add before a destination queue passes its limit, as of the
        last look (None: no limit): a pass cuts its batch to it, so that a queue ends at its
        limit, not a batch beyond it. A batch's rows may all go to one queue, so the least room counts."""
        if not self.limits or not self.last:
            return None
        return max(1, min(limit - self.last.get(q, 0) for q, (_, limit) in self.limits.items()))  # >= 1: not held

    def check(self) -> str | None:
        """Why the job is held now (None: it may go on); logs each change once."""
        if not self.limits:
            return None
        depths = self.depths()
        if self.held is None:
            # At its limit already: a batch would pass it (Passes cut each batch to the room left).
            over = [(q, n, self.limits[q][1]) for q, n in depths.items() if self.limits[q][1] - n < self.least_room[q]]
            if over:
                q, n, limit = over[0]
                if n > 2 * limit:
                    self.held = f"{q} holds over {2 * limit:,} > {limit:,}"
                else:
                    self.held = f"{q} holds {n:,} > {limit:,}" if n > limit else f"{q} holds {n:,} of {limit:,}"
                self.since = time.monotonic()
                log.info("held: %s (resuming below %d%%)", self.held, self.resume_percent)
        else:
            if all(n <= self.limits[q][1] * self.resume_percent / 100 for q, n in depths.items()):
                log.info("no longer held (%s, for %.0fs)", self.held, time.monotonic() - (self.since or time.monotonic()))
                self.held, self.since = None, None
        return self.held

    def adopt(self, held: str, since: datetime | None) -> None:
        """Takes over a hold the books show (held since `since`, UTC), when limits still apply:
        it ends, as any hold, below the low-water mark."""
        if self.limits and self.held is None:
            elapsed = max(0.0, (naive_utc(utcnow()) - since).total_seconds()) if since is not None else 0.0
            self.held, self.since = held, time.monotonic() - elapsed

    def held_for(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since
