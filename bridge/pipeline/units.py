"""Spark's units of work: a range of ids, a list of keys, or a slice of a scan source's keys,
each in batches without the queue's checkpoint. The ledger alone keeps a retried or duplicated
unit from delivering twice; a first attempt inserts without looking the ledger up first and
lets the ledger's key catch the rare message delivered already."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from bridge import faults, tracing
from bridge.errors import TargetSchemaError
from bridge.ledger.gaps import Gap, holes
from bridge.ledger.sqlite_order import sqlite_pass_order
from bridge.pipeline.job import LedgerConflict
from bridge.pipeline.passes import Passes
from bridge.pipeline.stats import PassStats, RangeResult
from bridge.retry import RETRIES, with_backoff
from bridge.sources import Source, SourceRow
from bridge.sources.fetched import keys_of, ledger_keys

log = logging.getLogger("qbridge.batch")
UNIT_POLL = 1.0  # seconds between looks at a pause or a hold, for a waiting Spark task


class Units(Passes):
    """The Spark units of JobRunner."""

    def run_range(self, queue: str, after: int | None, upto: int) -> RangeResult:
        """Every row with `after < key <= upto`, in batches, without the queue's checkpoint:
        the ledger alone keeps a retried or duplicated range from delivering twice. Ids in the
        range that no row had are returned as gaps for the driver to keep watching."""
        source = self.sources[queue]
        result = RangeResult(PassStats(queue))
        cursor = after
        # Per task attempt, not per runner (a Python worker, and its runner, serves many tasks):
        # a retried attempt has delivered some of its range already, so it looks the ledger up.
        if faults.attempt in (None, 0):
            self._optimistic.add(queue)
        else:
            self._optimistic.discard(queue)
        while True:
            rows = self._range_batch(source, cursor, upto, result.stats)
            now = time.time()
            keys = keys_of(rows)
            start = cursor if cursor is not None else 0
            result.gaps += holes(start, keys, now)
            if len(rows) < self.job.batch_size:
                last = keys[-1] if keys else start
                if last < upto:
                    result.gaps.append(Gap(last + 1, upto, now))
                return result
            cursor = keys[-1]

    def _range_batch(self, source: Source, after: int | None, upto: int, total: PassStats) -> Sequence[SourceRow]:
        def batch() -> Sequence[SourceRow]:
            return self._batch_tx(source, lambda sconn, lock: source.fetch_after(sconn, after, self.job.batch_size, lock, upto=upto), total)

        return with_backoff(batch, f"job {self.job.name} queue {source.queue} ids {after}..{upto}")

    def run_keys(self, queue: str, keys: Sequence[Any]) -> RangeResult:
        """A scan source's share of the work: these keys, in batches."""
        source = self.sources[queue]
        result = RangeResult(PassStats(queue))
        size = self.job.batch_size
        for start in range(0, len(keys), size):
            chunk = keys[start:start + size]

            def batch(c: Sequence[Any] = chunk) -> Sequence[SourceRow]:
                return self._batch_tx(source, lambda sconn, lock: source.fetch_keys(sconn, c, lock), result.stats)

            with_backoff(batch, f"job {self.job.name} queue {queue} keys {chunk[0]}..{chunk[-1]}")
        return result

    def run_slice(self, queue: str, after: Any, upto: Any) -> RangeResult:
        """A scan source's slice (keys sorted after `after`, up to `upto`): streamed in batches,
        each looked up in the ledger, only the new ones read and delivered."""
        source = self.sources[queue]
        result = RangeResult(PassStats(queue))
        size = self.job.batch_size
        cursor = after
        while True:
            with self.source_engine.connect() as kconn:
                chunk, last = source.slice_page(kconn, cursor, upto, size)
            if not chunk:
                return result
            with self.target_engine.connect() as tconn:
                known = self.ledger_lookup(tconn, source, chunk)
            # Move mode reads the delivered ones too: they are still there to be consumed.
            new = chunk if self.job.mode == "move" else [k for k in chunk if k not in known]
            result.stats.already += len(chunk) - len(new)
            if new:
                def batch(c: Sequence[Any] = new) -> Sequence[SourceRow]:
                    return self._batch_tx(source, lambda sconn, lock: source.fetch_keys(sconn, c, lock), result.stats)

                with_backoff(batch, f"job {self.job.name} queue {queue} keys {new[0]}..{new[-1]}")
            if len(chunk) < size:
                return result
            cursor = last

    def _entries_known(self, tconn: sa.Connection, source: Source, rows: Sequence[SourceRow]) -> dict[str, str]:
        """What a first attempt looks up: the per-message entries alone, not the range bits (which
        refuse a key recorded already when the batch records its own). A quarantined entry an
        earlier qbridge's cut-off fold left without its bit is found here, where the bits would
        not say it (tests/review/test_fold_merge_review.py)."""
        return self.state.known(tconn, self.origins[source.queue], ledger_keys(source, rows))

    def _batch_tx(self, source: Source, fetch, total: PassStats) -> Sequence[SourceRow]:
        """One batch in the two transactions of a pass; `total` is only added to once it commits."""
        with tracing.span("qbridge.batch", job=self.job.name, queue=source.queue, mode=self.job.mode,
                          retries=RETRIES.get() or None) as s:
            return self._unit_batch(source, fetch, total, s)

    def _unit_batch(self, source: Source, fetch, total: PassStats, span: Any) -> Sequence[SourceRow]:
        lock = self.job.mode == "move"
        self._wait_to_go()
        stats = PassStats(source.queue)
        started = time.monotonic()
        read: list[Sequence[SourceRow]] = []  # the batch's rows, once read (a Fetched is no list to extend)
        flight: list[str] = []  # the batch's row in qbridge_inflight, once its target commit went through
        if lock and not self.inflight_kept():
            raise TargetSchemaError(
                f"the target {self.job.target.connection!r} has no {self.state.inflight.table.name} table, where a move-mode "
                "migration records what its tasks delivered and have not consumed yet (made by `qbridge init` since "
                "issue 35): run `qbridge init -c CONFIG`")

        def deliver(sconn: sa.Connection) -> list:
            begun = time.perf_counter()
            read.append(fetch(sconn, lock))
            rows = read[0]
            fetched = time.perf_counter()
            stats.t_read += fetched - begun
            while True:
                optimistic = source.queue in self._optimistic
                attempt = PassStats(source.queue)  # counts of a batch that rolls back are dropped
                try:
                    with self.target_engine.connect() as tconn, tconn.begin():
                        consume = self._deliver(tconn, source, rows, lock, attempt,
                                                self._entries_known(tconn, source, rows) if optimistic else None)
                        # A rollback (or a pass) that runs before the consume below commits must
                        # see these keys as being consumed, not as rows still to deliver.
                        batch = self.state.inflight.add(tconn, self.job.name, source.queue, consume) if consume else None
                        self.fenced(tconn)
                        faults.reached("before_target_commit")
                    if batch is not None:
                        flight.append(batch)
                    break
                except LedgerConflict as e:
                    if not optimistic:
                        raise
                    self._optimistic.discard(source.queue)
                    # Marked as the in-process path marks a conflict: the exception on the batch's
                    # span and one more retry (here the same span goes on, with the lookup).
                    span.record_exception(e)
                    span.set_attribute("qbridge.retries", RETRIES.get() + 1)
            stats.add(attempt)
            stats.lag_seconds = attempt.lag_seconds
            stats.t_write += time.perf_counter() - fetched - attempt.t_map
            return consume

        with sqlite_pass_order(self.source_url, self.target_url):  # as a pass's (sqlite_order)
            self._in_source_tx(source, stats, deliver)
        rows = read[0]
        if flight:
            with self.target_engine.begin() as tconn:
                self.state.inflight.drop(tconn, self.job.name, source.queue, flight[0])
        stats.read = len(rows)
        stats.seconds = time.monotonic() - started
        self.pace.spent(len(rows))
        self._log(stats)
        tracing.counts(span, stats)
        total.add(stats)
        return rows

    def _wait_to_go(self) -> None:
        """A unit never ends early (its driver moves the checkpoint past all of its keys): paused
        or held, its next batch waits, saying why once, and the rate is kept."""
        why = self.may_go()
        if why is not None:
            log.info("%s; this task waits", why)
            while why is not None:
                time.sleep(UNIT_POLL)
                why = self.may_go()
            log.info("job=%s goes on", self.job.name)
        self.pace.wait()
