"""The one framework-owned loop every engine calls: read a batch, decode, map, write, commit.

A pass over one queue runs in two transactions: the source's (which, in move mode, holds the
rows it read skip-locked) and the target's. Queue rows, ledger entries, quarantine rows and
the moved checkpoint commit together in the target; only then are source rows consumed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge import faults
from bridge.config import Config, JobConfig
from bridge.db import describe, engine_for, unique_violation
from bridge.errors import BadRow, RetryableError
from bridge.identifiers import url_identity
from bridge.ledger_upgrade import require_current
from bridge.model import message_id_for, message_ids, queue_origin
from bridge.pipeline.gaps import Gap, expire, fill, holes
from bridge.retry import with_backoff
from bridge.sources import Source, SourceRow, Subscription, source_class
from bridge.state import LedgerEntry, Quarantined, State, merge_pending
from bridge.targets import target_class
from bridge.targets.base import Skipped, Target
from bridge.targets.nservicebus_target import NServiceBusTarget, transport_tables
from bridge.targets.writer import TargetWriter
from bridge.timefmt import utcnow

log = logging.getLogger("qbridge.batch")
SCAN_CHUNK = 10_000  # keys a scan pass (or verify) holds at once


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

    def add(self, other: PassStats) -> None:
        for name in ("read", "delivered", "skipped", "quarantined", "already", "consumed", "seconds", "t_read", "t_map", "t_write"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.gaps_open = other.gaps_open
        self.gaps_given_up.extend(other.gaps_given_up)
        if other.lag_seconds is not None:
            self.lag_seconds = other.lag_seconds


@dataclass
class RangeResult:
    """What one range or key list did, and the ids in it no row had (gaps to keep watching)."""

    stats: PassStats
    gaps: list[Gap] = field(default_factory=list)


def database_identity(job: JobConfig, url: str) -> str:
    """The name that, with system, queue and key, makes a message's deterministic id."""
    return job.source.database or url_identity(url)


class LedgerConflict(RetryableError):
    """A message of the batch is in the ledger already: delivered by another pass or process."""


class JobRunner:
    """Everything one job needs, built once per process."""

    def __init__(self, config: Config, job: JobConfig) -> None:
        self.job = job
        self.mapping = config.mapping(job)
        self.source_url = config.connections[job.source.connection]
        self.target_url = config.connections[job.target.connection]
        self.source_engine = engine_for(self.source_url)
        self.target_engine = engine_for(self.target_url)
        self.target: Target = target_class(job.target.system)(job, self.target_url, self.mapping)
        # The NServiceBus side's transport tables: the target of a forward job, the proxy
        # queues (and SubscriptionRouting) of a reverse one.
        if isinstance(self.target, NServiceBusTarget):
            self.tables = self.target.transport
        else:
            assert job.source.flavor is not None
            self.tables = transport_tables(job.source.flavor, job.source.schema_name, self.source_url, job.source.catalog)
        self.writer = TargetWriter(self.tables)
        self.state = State(self.target.state_schema)
        self.database = database_identity(job, self.source_url)
        cls = source_class(job.source.system)
        self.sources: dict[str, Source] = {
            q: cls(job, self.source_engine, q, self.database) for q in job.source.queues
        }
        # Each queue's name in the ledger's key (model.queue_origin).
        self.origins: dict[str, int] = {q: queue_origin(job.source.system, self.database, q) for q in job.source.queues}
        for source in self.sources.values():
            source.configure(self.mapping)
            source.due_only = not self.target.schedules
        self._ready: set[str] = set()
        self._ledger_checked = False
        self._version = 0
        # Queues whose planned ranges are taken to be new to the ledger: their batches insert
        # without looking the ledger up first, and the ledger's primary key catches the rare
        # message delivered already (the batch is then redone with the lookup, and so is the rest).
        self._optimistic: set[str] = set()
        self.on_batch: Any = None  # called with each committed batch's stats (qbridge run's metrics)
        # Common-case rows skip the CanonicalMessage when source and target both have a fast lane
        # (Source.plain, Target.plain_envelope); off, every row takes the validated path (tests
        # compare the two).
        self.fast_lane = True

    def message_id(self, source: Source, row: SourceRow) -> uuid.UUID:
        return message_id_for(source.system, self.database, source.queue, source.ledger_key(row))

    def ledger_lookup(self, tconn: sa.Connection, source: Source, keys: Sequence[Any]) -> dict[Any, str]:
        """source key -> outcome, for those of `keys` already in the ledger."""
        texts = [str(k) for k in keys]
        known = self.state.known(tconn, self.origins[source.queue], texts)
        return {k: known[t] for k, t in zip(keys, texts) if t in known}

    def check(self) -> None:
        """Both databases answer, source tables look right, checkpoints exist; a clear error if not."""
        job = self.job
        try:
            with self.source_engine.connect() as conn:
                for source in self.sources.values():
                    source.check_schema(conn)
        except sa_exc.SQLAlchemyError as e:
            raise describe(e, job.source.connection, self.source_url) from None
        try:
            for queue in self.sources:
                self._prepare(queue)
        except sa_exc.SQLAlchemyError as e:
            raise describe(e, job.target.connection, self.target_url) from None

    def check_ledger(self) -> None:
        """Stops with what to do on a ledger an earlier qbridge made (once per process)."""
        if not self._ledger_checked:
            with self.target_engine.connect() as tconn:
                require_current(tconn, self.state.ledger.schema, self.job.target.connection)
            self._ledger_checked = True

    def _prepare(self, queue: str) -> None:
        self.check_ledger()
        if queue not in self._ready:
            self.state.ensure_checkpoint(self.target_engine, self.job.name, queue)
            self._ready.add(queue)

    # -- one pass --------------------------------------------------------------------------
    def run_pass(self, queue: str) -> PassStats:
        self._prepare(queue)
        move = self.job.mode == "move"
        started = time.monotonic()
        stats = PassStats(queue)
        source = self.sources[queue]
        consume = self._in_source_tx(source, stats, lambda sconn: self._pass(sconn, source, stats, lock=move))
        if consume:
            faults.reached("after_source_commit")
            self.state.settle_pending(self.target_engine, self.job.name, queue, consume, self._version)
        stats.seconds = time.monotonic() - started
        self._log(stats)
        return stats

    def _pass(self, sconn: sa.Connection, source: Source, stats: PassStats, lock: bool) -> list:
        job = self.job
        now = time.time()
        with self.target_engine.connect() as tconn, tconn.begin():
            cp = self.state.lock_checkpoint(tconn, job.name, source.queue)
            given_up: list[Gap] = []
            if source.cursor == "scan":
                rows, stats.more, consume, known = self._scan(sconn, tconn, source, lock)
            elif source.cursor == "queue":  # consumed as read: the head of the queue, skip-locked
                rows, consume, known = source.fetch_after(sconn, None, job.batch_size, True), [], None
                stats.more = len(rows) >= job.batch_size
            else:
                new = source.fetch_after(sconn, cp.high, job.batch_size, lock)
                # Every gap is read before any is given up: a row that committed inside the
                # window but after the last pass looked (an outage, a sparse schedule, a long
                # migration) is found on the pass that would otherwise drop its gap.
                late = source.fetch_ranges(sconn, [(g.lo, g.hi) for g in cp.gaps], lock)
                still_open, given_up = expire(fill(cp.gaps, [r.key for r in late]), now, job.window_seconds)
                if given_up:
                    # A committed row the skip-locked read stepped over (a receiver holds it) is
                    # no gap to give up: its gap stays open until the row is read.
                    held = source.keys_in(sconn, [(g.lo, g.hi) for g in given_up])
                    kept = [g for g in given_up if any(g.lo <= k <= g.hi for k in held)]
                    if kept:
                        still_open += kept
                        given_up = [g for g in given_up if g not in kept]
                rows, consume, known = late + new, [], None
                stats.more = len(new) >= job.batch_size
                # Before the first row ever read, every id from 1 up may still commit late.
                start = cp.high if cp.high is not None else 0
                cp.gaps = still_open + holes(start, [r.key for r in new], now)
                if new:
                    cp.high = new[-1].key
            consume += self._deliver(tconn, source, rows, lock, stats, known)
            if cp.pending:
                # Delivered by a pass that died before its source commit (or is committing it
                # now): read under the checkpoint's lock, kept in the list, consumed with ours.
                log.info("job=%s queue=%s consuming %d source rows delivered by an interrupted pass",
                         job.name, source.queue, len(cp.pending))
            cp.pending = consume = merge_pending(cp.pending, consume)
            if stats.delivered:
                cp.last_delivery_at = utcnow()
                cp.lag_seconds = stats.lag_seconds
            self.state.save_checkpoint(tconn, cp)
            self._version = cp.version
            faults.reached("before_target_commit")
        stats.read = len(rows)
        stats.gaps_open = len(cp.gaps)
        stats.gaps_given_up = given_up
        for gap in given_up:
            log.info("job=%s queue=%s ids %d..%d never committed within %s; no longer waiting for them",
                     job.name, source.queue, gap.lo, gap.hi, job.late_commit_window)
        return consume

    def _deliver(self, tconn: sa.Connection, source: Source, rows: list[SourceRow], lock: bool, stats: PassStats,
                 known: dict[str, str] | None = None) -> list:
        """Decodes, maps and writes `rows` with their ledger entries in the caller's target
        transaction; returns the keys move mode may consume once it commits."""
        self.target.begin_batch(tconn)
        mapped = time.perf_counter()
        outs, entries, quarantined, consume = self._process(tconn, source, rows, lock, stats, known)
        stats.t_map += time.perf_counter() - mapped
        try:
            self.target.write(tconn, outs)
            self.state.record(tconn, self.job.name, source.queue, self.origins[source.queue], entries, quarantined)
        except sa_exc.IntegrityError as e:
            if not unique_violation(e):
                raise
            raise LedgerConflict(
                f"another qbridge process delivered messages of {source.queue!r} at the same time; the batch is rolled back and retried"
            ) from None
        return consume

    # -- ranges (the Spark engine's unit of work) -------------------------------------------
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
            keys = [r.key for r in rows]
            start = cursor if cursor is not None else 0
            result.gaps += holes(start, keys, now)
            if len(rows) < self.job.batch_size:
                last = keys[-1] if keys else start
                if last < upto:
                    result.gaps.append(Gap(last + 1, upto, now))
                return result
            cursor = keys[-1]

    def _range_batch(self, source: Source, after: int | None, upto: int, total: PassStats) -> list[SourceRow]:
        def batch() -> list[SourceRow]:
            return self._batch_tx(source, lambda sconn, lock: source.fetch_after(sconn, after, self.job.batch_size, lock, upto=upto), total)

        return with_backoff(batch, f"job {self.job.name} queue {source.queue} ids {after}..{upto}")

    def run_keys(self, queue: str, keys: Sequence[Any]) -> RangeResult:
        """A scan source's share of the work: these keys, in batches."""
        source = self.sources[queue]
        result = RangeResult(PassStats(queue))
        size = self.job.batch_size
        for start in range(0, len(keys), size):
            chunk = keys[start:start + size]
            with_backoff(lambda c=chunk: self._batch_tx(source, lambda sconn, lock: source.fetch_keys(sconn, c, lock), result.stats),
                         f"job {self.job.name} queue {queue} keys {chunk[0]}..{chunk[-1]}")
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
                with_backoff(lambda c=new: self._batch_tx(source, lambda sconn, lock: source.fetch_keys(sconn, c, lock), result.stats),
                             f"job {self.job.name} queue {queue} keys {new[0]}..{new[-1]}")
            if len(chunk) < size:
                return result
            cursor = last

    def _batch_tx(self, source: Source, fetch, total: PassStats) -> list[SourceRow]:
        """One batch in the two transactions of a pass; `total` is only added to once it commits."""
        lock = self.job.mode == "move"
        stats = PassStats(source.queue)
        started = time.monotonic()
        rows: list[SourceRow] = []

        def deliver(sconn: sa.Connection) -> list:
            begun = time.perf_counter()
            rows.extend(fetch(sconn, lock))
            fetched = time.perf_counter()
            stats.t_read += fetched - begun
            while True:
                optimistic = source.queue in self._optimistic
                attempt = PassStats(source.queue)  # counts of a batch that rolls back are dropped
                try:
                    with self.target_engine.connect() as tconn, tconn.begin():
                        consume = self._deliver(tconn, source, rows, lock, attempt, {} if optimistic else None)
                        faults.reached("before_target_commit")
                    break
                except LedgerConflict:
                    if not optimistic:
                        raise
                    self._optimistic.discard(source.queue)
            stats.add(attempt)
            stats.lag_seconds = attempt.lag_seconds
            stats.t_write += time.perf_counter() - fetched - attempt.t_map
            return consume

        self._in_source_tx(source, stats, deliver)
        stats.read = len(rows)
        stats.seconds = time.monotonic() - started
        self._log(stats)
        total.add(stats)
        return rows

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
        there are consumed."""
        todo: list[Any] = []
        leftovers: list[Any] = []
        size = self.job.batch_size
        more = False
        keys = source.iter_keys(sconn)
        try:
            for chunk in chunked(keys, SCAN_CHUNK):
                seen = self.ledger_lookup(tconn, source, chunk)
                for k in chunk:
                    outcome = seen.get(k)
                    if outcome is None:
                        if len(todo) < size:
                            todo.append(k)
                        else:
                            more = True
                    elif lock and outcome in ("delivered", "skipped") and len(leftovers) < SCAN_CHUNK:
                        leftovers.append(k)
                if more and not lock:
                    break
        finally:
            close = getattr(keys, "close", None)
            if close:
                close()
        # Every key in `todo` was unknown to the ledger: the batch needs no second lookup (a
        # racing process is caught by the ledger's primary key, and the pass is retried).
        return source.fetch_keys(sconn, todo, lock), more, leftovers, {}

    def _process(self, tconn: sa.Connection, source: Source, rows: list[SourceRow], lock: bool, stats: PassStats,
                 known: dict[str, str] | None = None
                 ) -> tuple[list[Any], list[LedgerEntry], list[Quarantined], list[Any]]:
        keys = [source.ledger_key(r) for r in rows]
        ids = message_ids(source.system, self.database, source.queue, keys)
        if known is None:  # scan passes looked their keys up already (and pass {})
            known = self.state.known(tconn, self.origins[source.queue], keys)
        # Each row's outcome goes into `known` as it is settled: a later copy of the same key in
        # this batch (a reverse job's message an endpoint sent twice) counts as already there.
        known = dict(known)
        lane = self.fast_lane and type(source).plain is not Source.plain and type(self.target).plain_envelope is not Target.plain_envelope
        outs: list[Any] = []
        entries: list[LedgerEntry] = []
        quarantined: list[Quarantined] = []
        consume: list[Any] = []
        translated = getattr(source, "translated_headers", frozenset())
        take_quarantined = lock and source.consumes_quarantined
        now = utcnow()
        oldest = None
        ledger_target = self.target.ledger_target
        for row, key, mid in zip(rows, keys, ids):
            seen = known.get(key)
            if seen is not None:
                stats.already += 1
                if lock and row.consumable and (seen != "quarantined" or take_quarantined):
                    consume.append(row.key)
                continue
            fast = self._plain(source, row, mid, translated) if lane else None
            if fast is not None:
                result, sent = fast
            else:
                msg, result, reason = self.map_row(source, row, translated)
                if result is None:
                    quarantined.append(Quarantined(mid, key, reason, source.raw(row)))
                    entries.append(LedgerEntry(mid, key, "quarantined", None, reason))
                    known[key] = "quarantined"
                    stats.quarantined += 1
                    if take_quarantined and row.consumable:
                        consume.append(row.key)
                    continue
                sent = msg.time_sent
            if isinstance(result, Skipped):
                entries.append(LedgerEntry(mid, key, "skipped", None, result.reason))
                known[key] = "skipped"
                stats.skipped += 1
            else:
                outs.append(result)
                entries.append(LedgerEntry(mid, key, "delivered", ledger_target(result)))
                known[key] = "delivered"
                stats.delivered += 1
                if oldest is None or sent < oldest:
                    oldest = sent
            if lock and row.consumable:
                consume.append(row.key)
        if oldest is not None:
            stats.lag_seconds = max(0.0, (now - oldest).total_seconds())
        return outs, entries, quarantined, consume

    def _plain(self, source: Source, row: SourceRow, message_id: str, translated: frozenset[str]
               ) -> tuple[Any, Any] | None:
        """(what the target makes of it, when it was sent) by the fast lane: no CanonicalMessage.
        None when the row is not the common case, or anything at all goes wrong on the way: the
        validated path (`map_row`) then reads it again and says what is wrong."""
        try:
            msg = source.plain(row, message_id)
            if msg is None:
                return None
            out = self.target.plain_envelope(msg, translated)
        except Exception:
            return None
        return None if out is None else (out, msg.time_sent)

    def map_row(self, source: Source, row: SourceRow, translated: frozenset[str] = frozenset()
                ) -> tuple[Any, Any, str]:
        """(message, what the target makes of it, "") or (None, None, why it is quarantined)."""
        try:
            msg = source.decode(row)
            return msg, self.target.envelope(msg, translated), ""
        except BadRow as e:
            return None, None, str(e)
        except Exception as e:  # a bug must not block the rows behind it: keep the row, say why
            log.exception("job=%s queue=%s key=%s: unexpected error while decoding", self.job.name, source.queue,
                          source.ledger_key(row))
            return None, None, f"unexpected {type(e).__name__}: {e}"

    def _log(self, s: PassStats) -> None:
        if self.on_batch is not None and s.read:
            self.on_batch(s)
        if s.read or s.gaps_given_up:
            log.info(
                "job=%s queue=%s rows=%d delivered=%d skipped=%d quarantined=%d already=%d consumed=%d "
                "open_gaps=%d lag=%s duration=%.3fs",
                self.job.name, s.queue, s.read, s.delivered, s.skipped, s.quarantined, s.already, s.consumed,
                s.gaps_open, "-" if s.lag_seconds is None else f"{s.lag_seconds:.3f}s", s.seconds,
            )

    # -- loops -----------------------------------------------------------------------------
    def drain(self, queue: str, on_pass=None, should_stop=lambda: False, before_pass=lambda: None) -> PassStats:
        """Passes until the queue has no full batch left (or `should_stop` says so); `before_pass`
        runs before each (`qbridge run` checks there that it still holds the job)."""
        total = PassStats(queue)
        while True:
            before_pass()
            stats = self.run_pass(queue)
            total.add(stats)
            if on_pass:
                on_pass(stats)
            if not stats.more or should_stop():
                return total

    def sync_subscriptions(self) -> int:
        """Legacy subscriptions -> SubscriptionRouting; returns how many rows changed."""
        if self.job.reverse:
            return self._sync_proxy_subscriptions()
        with self.source_engine.connect() as sconn:
            subs = sorted({s for source in self.sources.values() for s in source.subscriptions(sconn)},
                          key=lambda s: (s.endpoint, s.topic))
        rows = []
        for sub in subs:
            endpoint = self.mapping.routes.get(sub.endpoint)
            if endpoint is None:
                continue  # a subscriber this job does not migrate; `verify` lists it
            topic = self.mapping.map_topic(sub.topic)
            rows.append((Subscription(endpoint=sub.endpoint, topic=topic), endpoint, self.tables.address(endpoint)))
        if not rows:
            return 0
        with self.target_engine.begin() as tconn:
            return self.writer.write_subscriptions(tconn, rows)

    def _sync_proxy_subscriptions(self) -> int:
        """Reverse jobs: a legacy subscriber served by a proxy queue subscribes that proxy queue,
        so an NServiceBus `Publish` of the type reaches it through this job."""
        proxies: dict[str, list[str]] = {}
        for proxy in self.sources:
            legacy = self.mapping.route([proxy])
            if legacy is not None:
                proxies.setdefault(legacy, []).append(proxy)
        with self.target_engine.connect() as tconn:
            subs = self.target.subscriptions(tconn)
        rows = [(Subscription(endpoint=proxy, topic=self.mapping.map_topic(sub.topic)), proxy, self.tables.address(proxy))
                for sub in subs for proxy in proxies.get(sub.endpoint, [])]
        if not rows:
            return 0
        with self.source_engine.begin() as sconn:
            return self.writer.write_subscriptions(sconn, rows)
