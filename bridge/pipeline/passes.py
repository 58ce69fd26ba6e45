"""Passes over one queue, by the source's cursor kind: after a checkpoint with id gaps
(monotonic), the head of the queue (queue), or every key against the ledger (scan). A pass runs
in two transactions: the source's (which, in move mode, holds the rows it read skip-locked) and
the target's. Queue rows, ledger entries, quarantine rows and the moved checkpoint commit
together in the target; only then are source rows consumed."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import sqlalchemy as sa

from bridge import faults, tracing
from bridge.ledger import giveback
from bridge.ledger.gaps import Gap, expire, fill, holes
from bridge.ledger.sqlite_order import sqlite_pass_order
from bridge.ledger.state import merge_pending, pending_key
from bridge.ledger.totals import FOLD_EVERY
from bridge.pipeline.columnar import ahead_columns
from bridge.pipeline.job import LedgerConflict
from bridge.pipeline.leftovers import Leftovers
from bridge.pipeline.logcontext import about
from bridge.pipeline.oldest import Oldest
from bridge.pipeline.read_ahead import next_batch
from bridge.pipeline.stats import REFILLS_A_WALK, SCAN_CHUNK, SCAN_RESERVE, PassStats, chunked
from bridge.retry import RETRIES
from bridge.sources import Source, SourceRow
from bridge.sources.fetched import joined, keys_of
from bridge.timefmt import utcnow

log = logging.getLogger("qbridge.batch")
# New keys a walk in no age order finds, above which the drain's log says that migrate is faster.
BACKLOG_HINT = 100_000


class Passes(Leftovers):
    """The passes of JobRunner (`sync --once`, `qbridge run`, the end of `migrate`)."""

    def run_pass(self, queue: str) -> PassStats:
        with tracing.span("qbridge.batch", job=self.job.name, queue=queue, mode=self.job.mode,
                          retries=RETRIES.get() or None) as s, about(self.job.name, queue):
            stats = self._run_pass(queue)
            tracing.counts(s, stats)
            return stats

    def _run_pass(self, queue: str) -> PassStats:
        with sqlite_pass_order(self.source_url, self.target_url):  # two SQLite files: one lock order (sqlite_order)
            self._prepare(queue)
            move = self.job.mode == "move"
            if move:
                self._consume_pending(queue)
            started = time.monotonic()
            stats = PassStats(queue)
            source = self.sources[queue]
            consume = self._in_source_tx(source, stats, lambda sconn: self._pass(sconn, source, stats, lock=move))
            if consume:
                faults.reached("after_source_commit")
                self.state.settle_pending(self.target_engine, self.job.name, queue, consume, self._settle_version, self.fence)
        stats.seconds = time.monotonic() - started
        self._log(stats)
        return stats

    def _pass(self, sconn: sa.Connection, source: Source, stats: PassStats, lock: bool) -> list:
        job = self.job
        now = time.time()
        with self.target_engine.connect() as tconn, tconn.begin():
            cp = self.state.lock_checkpoint(tconn, job.name, source.queue)
            if self.givebacks_kept(tconn) and giveback.anything_owed(tconn, self.state, job.name, source.queue):
                # A rollback withdrew rows after this pass gave back what was owed: read now, they
                # would be taken as processed. Redone, the pass gives them back first.
                self.owed_queues.add(source.queue)
                raise LedgerConflict(f"a rollback of {source.queue!r} owes legacy rows back; the pass is redone after "
                                     "they are given back")
            given_up: list[Gap] = []
            rows: Sequence[SourceRow]
            if source.cursor == "scan":
                rows, stats.more, consume, known = self._scan(sconn, tconn, source, lock)
            elif source.cursor == "queue":  # consumed as read: the head of the queue, skip-locked
                rows, consume, known = source.fetch_after(sconn, None, job.batch_size, True), [], None
                stats.more = len(rows) >= job.batch_size
            else:
                # Copy mode: the rows a read-ahead read while the last pass committed, when they
                # are the ones this pass would read (pipeline/read_ahead.py).
                new = None if lock else self.read_ahead.take(source.queue, (cp.high, job.batch_size))
                if new is None:
                    new = source.fetch_after(sconn, cp.high, job.batch_size, lock)
                if not lock and len(new) >= job.batch_size:
                    self.read_ahead.start(source, keys_of(new)[-1], job.batch_size, partial(ahead_columns, self, source))
                # Every gap is read before any is given up: a row that committed inside the
                # window but after the last pass looked (an outage, a sparse schedule, a long
                # migration) is found on the pass that would otherwise drop its gap.
                late = source.fetch_ranges(sconn, [(g.lo, g.hi) for g in cp.gaps], lock)
                still_open, given_up = expire(fill(cp.gaps, keys_of(late)), now, job.window_seconds)
                if given_up:
                    # A committed row the skip-locked read stepped over (a receiver holds it) is
                    # no gap to give up: its gap stays open until the row is read.
                    held = source.keys_in(sconn, [(g.lo, g.hi) for g in given_up])
                    kept = [g for g in given_up if any(g.lo <= k <= g.hi for k in held)]
                    if kept:
                        still_open += kept
                        given_up = [g for g in given_up if g not in kept]
                rows, consume, known = joined(late, new), [], None
                stats.more = len(new) >= job.batch_size
                # Before the first row ever read, every id from 1 up may still commit late.
                start = cp.high if cp.high is not None else 0
                new_keys = keys_of(new)
                cp.gaps = still_open + holes(start, new_keys, now)
                if new_keys:
                    cp.high = new_keys[-1]
            if consume and cp.pending:  # a scan's leftovers that are pending are _consume_pending's
                carried_keys = {pending_key(k) for k in cp.pending}
                consume = [k for k in consume if pending_key(k) not in carried_keys]
            consume += self._deliver(tconn, source, rows, lock, stats, known)
            # Merged, never overwritten: keys another pass left here (it died before its source
            # commit, or is committing it now) stay for `_consume_pending`; this pass consumes
            # only its own rows, which it holds, so it never waits on another pass's locks.
            carried = bool(cp.pending)
            cp.pending = merge_pending(cp.pending, consume)
            if stats.delivered:
                cp.last_delivery_at = utcnow()
                cp.lag_seconds = stats.lag_seconds
            self.state.save_checkpoint(tconn, cp)
            self._settle_version = None if carried else cp.version
            if cp.version % FOLD_EVERY == 0:  # under the checkpoint lock, which serialises the folders
                self.state.totals.fold(tconn, job.name, source.queue, self.origins[source.queue])
            self.fenced(tconn)
            faults.reached("before_target_commit")
        stats.read = len(rows)
        stats.gaps_open = len(cp.gaps)
        stats.gaps_given_up = given_up
        for gap in given_up:
            log.info("job=%s queue=%s ids %d..%d never committed within %s; no longer waiting for them",
                     job.name, source.queue, gap.lo, gap.hi, job.late_commit_window)
        return consume

    def _in_source_tx(self, source: Source, stats: PassStats, deliver) -> list:
        """The two commits of a batch: `deliver(sconn)` reads in the source transaction and
        commits the target; then move mode consumes what it returns, and the source commits."""
        with self.source_engine.connect() as sconn:
            stx = sconn.begin()
            try:
                consume = deliver(sconn)
                faults.reached("after_target_commit")
                if consume:
                    stats.consumed = source.consume(sconn, consume)
                stx.commit()
            except BaseException:
                stx.rollback()
                raise
        return consume

    def _scan(self, sconn: sa.Connection, tconn: sa.Connection, source: Source, lock: bool
              ) -> tuple[list[SourceRow], bool, list, dict[str, str]]:
        """A source without an increasing key: walk every row's key, in chunks, and let the ledger
        say which are new, until one batch of new keys is found (memory stays bounded by a chunk
        and a batch, whatever the store holds). In move mode, rows delivered earlier but still
        there are consumed. The walk goes in the keyset's order, which is the ledger's, so the
        lookups read the ledger's index in order; the batch is the oldest of the new keys.

        A copy-mode walk that goes oldest first starts after the drain's last committed batch:
        every new key before that point was in a batch and is in the ledger now, so walking the
        delivered keys again made each pass longer than the last (a drain of n keys read n²/2b of
        them). Once a walk on finds the end, the drain's last pass walks from the first key again
        (Passes._drain): a key the legacy side put behind the walk meanwhile is not left there.

        A walk whose order is not the age (OpenJMS) must read every key to find the oldest: it
        keeps the SCAN_RESERVE oldest new keys, and the drain's next passes take their batches
        from them, oldest first, until they run out (a drain of n keys walked n²/2b keys: 25k
        handles took 10 s). Where the walk found more, the reserve is refilled by the database
        in age order after the reserve's last key (`_refill`), not by another walk (n²/2r keys
        walked: 200k handles took 67 s), REFILLS_A_WALK times; then a walk from the first key
        again, so that a key older than the reserve's (committed late, given back) waits a
        bounded number of reserves, however fast new keys come. A drain that took batches so
        walks every key once more at its end, as one that walked on does."""
        size = self.job.batch_size
        q = source.queue
        if not source.walks_oldest_first:
            if self.reserves.get(q):
                self.walk_ends[q] = self.walked_to.get(q)  # where the next refill starts, until one moves it
                batch, self.reserve_ends[q] = self._from_reserve(tconn, source, self.reserves[q], size)
                return self._rows_of(sconn, source, batch, lock), bool(self.reserve_ends[q]), [], {}
            if self.walked_to.get(q) is not None and self.refills.get(q, 0) < REFILLS_A_WALK:
                self.refills[q] = self.refills.get(q, 0) + 1
                return self._refill(sconn, tconn, source, lock, size)
            self.refills.pop(q, None)  # this pass walks from the first key
        oldest = Oldest(size if source.walks_oldest_first else max(size, SCAN_RESERVE))
        leftovers: list[Any] = []
        new = 0
        resumes = source.walks_oldest_first and not lock
        after = self.walked_to.get(source.queue) if resumes else None
        # After the last batch nearly every key is new: a chunk (and a fetch) of a batch and one
        # more fills it, where one of SCAN_CHUNK keys read and made text ten keys a message.
        step = SCAN_CHUNK if after is None else min(SCAN_CHUNK, size + 1)
        walk = source.iter_aged(sconn) if after is None else source.iter_aged(sconn, after, step)
        try:
            for chunk in chunked(walk, step):
                for k, age in self._unknown(tconn, source, chunk, lock, leftovers):
                    new += 1
                    oldest.add(age, k)
                if oldest.full() and resumes:
                    break  # the rest is younger than this batch
        finally:
            close = getattr(walk, "close", None)
            if close:
                close()
        batch = oldest.keys()
        self.walk_ends[q] = source.sort_of(batch[-1]) if resumes and oldest.more and batch else None
        more = oldest.more
        if not source.walks_oldest_first:
            # More new keys than the reserve holds: the drain refills it after the reserve's last.
            self.walk_ends[q] = source.age_sort(*oldest.last()) if oldest.more and batch else None
            batch, self.reserve_ends[q] = batch[:size], batch[size:]
            more = more or bool(self.reserve_ends[q])
            if new > BACKLOG_HINT and q not in self.backlog_told:  # once a process and queue: bounded
                self.backlog_told.add(q)
                log.info("job=%s queue=%s %d messages wait; passes have the database sort all of them once each %d they take: "
                         "`qbridge migrate` moves a backlog this size in one walk", self.job.name, q, new, SCAN_RESERVE)
        # Every key in the batch was unknown to the ledger: it needs no second lookup (a racing
        # process is caught by the ledger's primary key, and the pass is retried).
        return self._rows_of(sconn, source, batch, lock), more, leftovers, {}

    def _refill(self, sconn: sa.Connection, tconn: sa.Connection, source: Source, lock: bool, size: int
                ) -> tuple[list[SourceRow], bool, list, dict[str, str]]:
        """A pass of a drain whose reserve ran out while a walk found more: the next SCAN_RESERVE
        new keys in age order after the last the drain reserved, sorted by the database
        (Source.aged_after), looked up in the ledger as a walk's are; the first batch of them is
        this pass's, the rest the reserve. None found: the drain's last pass walks every key."""
        q = source.queue
        want = max(size, SCAN_RESERVE)
        found: list[Any] = []
        leftovers: list[Any] = []
        after, end = self.walked_to[q], None
        while len(found) < want:
            asked = want - len(found)
            page = source.aged_after(sconn, after, asked)
            for chunk in chunked(page, SCAN_CHUNK):
                fresh = self._unknown(tconn, source, chunk, lock, leftovers)
                found += [k for k, _ in fresh]
                if fresh:
                    end = fresh[-1][1]
            if len(page) < asked:
                end = None  # the end of the handles: nothing after the last is left to refill from
                break
            after = page[-1][1]
        self.walk_ends[q] = end
        batch, self.reserve_ends[q] = found[:size], found[size:]
        return self._rows_of(sconn, source, batch, lock), bool(self.reserve_ends[q]) or end is not None, leftovers, {}

    def _rows_of(self, sconn: sa.Connection, source: Source, batch: list[Any], lock: bool) -> list[SourceRow]:
        """A scan batch's rows: fetched ahead while the last pass committed, when they are exactly
        this batch's keys (pipeline/read_ahead.py); and the next batch's fetch begun."""
        rows = None if lock else self.read_ahead.take(source.queue, batch)
        if rows is None:
            rows = source.fetch_keys(sconn, batch, lock)
        keys = None if lock else next_batch(source, self.walk_ends.get(source.queue), self.job.batch_size)
        if keys is not None:  # rows only: columns made beside the write cost a BizTalk drain more than they saved
            self.read_ahead.start_keys(source, keys)
        return rows

    def _unknown(self, tconn: sa.Connection, source: Source, chunk: list[tuple[Any, Any]], lock: bool,
                 leftovers: list[Any]) -> list[tuple[Any, Any]]:
        """The (key, its age or sort) pairs of a walk's or a refill's `chunk` the ledger does not
        hold. In move mode a key it holds as delivered or skipped is still there to consume: it
        goes to `leftovers` (SCAN_CHUNK of them at most)."""
        seen = self.ledger_lookup(tconn, source, [k for k, _ in chunk])
        fresh = []
        for k, x in chunk:
            outcome = seen.get(k)
            if outcome is None:
                fresh.append((k, x))
            elif lock and outcome in ("delivered", "skipped") and len(leftovers) < SCAN_CHUNK:
                leftovers.append(k)
        return fresh

    def _from_reserve(self, tconn: sa.Connection, source: Source, reserve: list[Any], size: int
                      ) -> tuple[list[Any], list[Any]]:
        """The next batch of a walk's reserve, and what stays: keys the ledger has meanwhile
        (another process, a pass retried) are dropped; a key since consumed is simply not fetched."""
        batch: list[Any] = []
        taken = 0
        while len(batch) < size and taken < len(reserve):
            chunk = reserve[taken:taken + size - len(batch)]
            taken += len(chunk)
            seen = self.ledger_lookup(tconn, source, chunk)
            batch += [k for k in chunk if k not in seen]
        return batch, reserve[taken:]

    def drain(self, queue: str, on_pass=None, should_stop=lambda: False, before_pass=lambda: None) -> PassStats:
        """Passes until the queue has no full batch left (or `should_stop` says so); `before_pass`
        runs before each (`qbridge run` checks there that it still holds the job)."""
        with tracing.span("qbridge.drain", job=self.job.name, queue=queue) as s, about(self.job.name, queue):
            try:
                self.read_ahead.draining.add(queue)
                total = self._drain(queue, on_pass, should_stop, before_pass)
            finally:  # a reserve and a walk's place serve their own drain's passes: a pass outside one walks
                self.read_ahead.draining.discard(queue)
                self.read_ahead.drop(queue)
                self.reserves.pop(queue, [])
                self.walked_to.pop(queue, None)
                self.refills.pop(queue, None)
            tracing.counts(s, total)
            if total.waiting:
                s.set_attribute("qbridge.waiting", total.waiting)
            return total

    def _drain(self, queue: str, on_pass, should_stop, before_pass) -> PassStats:
        total = PassStats(queue)
        self.walked_to.pop(queue, None)  # a drain's first walk, and a retried drain's, starts at the beginning
        while True:
            before_pass()
            why = self.may_go()
            if why is not None:  # paused or held: the batch before this one has committed
                total.waiting = why
                return total
            self.pace.wait(should_stop)
            if should_stop():
                return total
            self.size_batch(self.pressure.room())
            self.walk_ends.pop(queue, None)
            self.reserve_ends.pop(queue, [])
            resumed = self.walked_to.get(queue) is not None or bool(self.reserves.get(queue))
            try:
                stats = self.run_pass(queue)
            finally:
                self.size_batch(None)
            self.walked_to[queue] = self.walk_ends.pop(queue, None)  # the pass committed
            self.reserves[queue] = self.reserve_ends.pop(queue, [])
            self.pace.spent(stats.read)
            self.passes_done += 1  # committed: with_backoff's count of progress
            RETRIES.set(0)  # the next batch is a first attempt, though the drain may be a retry (its span says so)
            total.add(stats)
            if on_pass:
                on_pass(stats)
            # A walk on that found the end is followed by one walk from the first key before the
            # drain says it is done: keys the legacy side put behind it meanwhile (a new message,
            # an operator's resume of a suspended instance) are not left for the next drain.
            if not (stats.more or resumed) or should_stop():
                return total

