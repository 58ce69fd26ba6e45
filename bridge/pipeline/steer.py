"""What a job's batches wait for (issue 38): a rate cap (`max_rate`) and back-pressure from the
destination queues (`max_target_depth`). An operator's pause is read from the target database
(bridge.ledger.steering); both of these are judged by the process running the batches."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import sqlalchemy as sa

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
    """Back-pressure: holds the job while a destination queue holds more rows than its limit,
    until every one is below `resume_percent` of its limit. A queue's depth is counted up to
    twice its limit (`SELECT count(*) FROM (SELECT 1 ... LIMIT 2n+1)`): exact where it matters,
    never an estimate that could err on the unsafe side, and never more than 2n+1 rows read,
    however deep the queue is."""

    def __init__(self, engine: sa.Engine, limits: dict[str, tuple[sa.Table, int]], resume_percent: int) -> None:
        self.engine = engine
        self.limits = limits  # queue -> (its table, the most rows it may hold)
        self.resume_percent = resume_percent
        self.held: str | None = None  # why the job is held now
        self.since: float | None = None  # monotonic time the hold began
        self.deepest: dict[str, int] = {}  # queue -> most rows seen (as counted: at most 2 limit + 1)

    def depths(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.engine.connect() as conn:
            for queue, (table, limit) in self.limits.items():
                capped = sa.select(sa.literal(1)).select_from(table).limit(2 * limit + 1).subquery()
                out[queue] = int(conn.execute(sa.select(sa.func.count()).select_from(capped)).scalar_one())
                self.deepest[queue] = max(self.deepest.get(queue, 0), out[queue])
        return out

    def check(self) -> str | None:
        """Why the job is held now (None: it may go on); logs each change once."""
        if not self.limits:
            return None
        depths = self.depths()
        if self.held is None:
            over = [(q, n, self.limits[q][1]) for q, n in depths.items() if n > self.limits[q][1]]
            if over:
                q, n, limit = over[0]
                self.held = f"{q} holds {n:,} > {limit:,}" if n <= 2 * limit else f"{q} holds over {2 * limit:,} > {limit:,}"
                self.since = time.monotonic()
                log.info("held: %s (resuming below %d%%)", self.held, self.resume_percent)
        else:
            if all(n <= self.limits[q][1] * self.resume_percent / 100 for q, n in depths.items()):
                log.info("no longer held (%s, for %.0fs)", self.held, time.monotonic() - (self.since or time.monotonic()))
                self.held, self.since = None, None
        return self.held

    def held_for(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since
