"""A job's setup, built once per process: its engines, sources, target, state tables and the
identities its messages are keyed by; the checks before its first pass; its subscriptions."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge import tracing
from bridge.config import Config, JobConfig, mask_url
from bridge.db import describe, engine_for, reading
from bridge.errors import RetryableError, SourceSchemaError, TargetSchemaError
from bridge.identifiers import url_identity
from bridge.ledger import giveback
from bridge.ledger.fence import Fence
from bridge.ledger.ranges_upgrade import fresh_fold_left, unfolded
from bridge.ledger.state import State
from bridge.ledger.steering import Steering
from bridge.ledger.upgrade import require_current
from bridge.model import message_id_for, message_ids, queue_origin
from bridge.pipeline.read_ahead import ReadAhead
from bridge.pipeline.stats import PassStats
from bridge.pipeline.steer import Pace, Pressure, rate_batch
from bridge.schemas.nservicebus import transport_tables
from bridge.sources import Source, SourceRow, Subscription, source_class
from bridge.targets import target_class
from bridge.targets.base import Target
from bridge.targets.nservicebus import NServiceBusTarget
from bridge.targets.writer import TargetWriter

# How long a process trusts that a later state table is missing before it looks again (kept()).
KEPT_RECHECK_SECONDS = 10.0

log = logging.getLogger("qbridge.batch")


def database_identity(job: JobConfig, url: str) -> str:
    """The name that, with system, queue and key, makes a message's deterministic id."""
    return job.source.database or url_identity(url)



class LedgerConflict(RetryableError):
    """A message of the batch is in the ledger already: delivered by another pass or process."""



class JobSetup:
    """Everything one job needs, built once per process (the passes, units and batches of
    bridge.pipeline.loop.JobRunner work on it)."""

    def __init__(self, config: Config, job: JobConfig) -> None:
        self.config = config  # a replay from the status page makes a runner of its own from it
        self.configured = job  # as the config says; `job` is it with the batch a rate allows
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
        traced = tracing.configured() if job.trace_messages is None else job.trace_messages
        for writer in (self.writer, getattr(self.target, "writer", None)):  # the forward target's writes its queues
            if isinstance(writer, TargetWriter):
                writer.trace_messages = traced
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
            source.keep_bodies = self.mapping.rewrites_bodies
            source.due_only = not self.target.schedules
        self._ready: set[str] = set()
        self._ledger_checked = False
        # Which of the later state tables the target has (kept()): True, or when one was last missed.
        self._kept: dict[str, float | bool] = {}
        self.kept_recheck_seconds = KEPT_RECHECK_SECONDS
        # The fencing epoch of the job's lock, when this process holds it (bridge.ledger.fence): every
        # transaction that writes the job's books checks it last. None: not checked (tests that
        # drive a runner directly; quarantine replay, which serialises on the checkpoint row).
        self.fence: Fence | None = None
        # Queues whose owed rows are given back at their next _prepare: every queue once a
        # process, and again after a pass found rows owed under its checkpoint lock (Passes._pass).
        self.owed_queues: set[str] = set(job.source.queues)
        # The checkpoint version the last pass saved, when its pending list held its own keys
        # alone (settle_pending's fast path); None when other passes' keys were there too.
        self._settle_version: int | None = None
        # Queues whose planned ranges are taken to be new to the ledger: their batches insert
        # without looking the ledger up first, and the ledger's primary key catches the rare
        # message delivered already (the batch is then redone with the lookup, and so is the rest).
        self._optimistic: set[str] = set()
        self.on_batch: Any = None  # called with each committed batch's stats (qbridge run's metrics)
        self.passes_done = 0  # passes committed by drain: retries start afresh after progress (bridge.retry)
        # Scan queues walked oldest first: where the walk of the drain's next pass starts (after
        # the last committed batch's last key), and where the running pass's batch ends; walked in
        # no age order: where the drain's next refill starts (after its reserve's last key).
        self.walked_to: dict[str, tuple[Any, ...] | None] = {}
        self.walk_ends: dict[str, tuple[Any, ...] | None] = {}
        # Scan queues walked in no age order: the oldest new keys the drain's last walk found
        # that no batch has taken yet, and what the running pass leaves of them.
        self.reserves: dict[str, list[Any]] = {}
        self.reserve_ends: dict[str, list[Any]] = {}
        self.refills: dict[str, int] = {}  # reserves a drain refilled since it last walked from the first key
        self.backlog_told: set[str] = set()  # queues whose backlog the log has advised migrate for
        # Common-case rows skip the CanonicalMessage when source and target both have a fast lane
        # (Source.plain, Target.plain_envelope); off, every row takes the validated path (tests
        # compare the two).
        self.fast_lane = True
        self.columnar = True  # the columnar lane (pipeline/columnar.py), where source and target have it
        # Below this many new rows a batch takes the per-row lanes; None: the source's own
        # (Source.lane_min_rows, measured), a number: that one (tests set 1 to force the lane).
        self.lane_min_rows: int | None = None
        self.pace = Pace(None)
        self.read_ahead = ReadAhead(self.source_engine)  # a drain's next batch, read while a pass commits
        self.set_rate(job.rate_per_second)
        limits = {}
        if isinstance(self.target, NServiceBusTarget):
            for queue in self.mapping.target_queues():
                limit = job.depth_limit(queue)
                if limit is not None:
                    limits[queue] = (self.tables.queue(queue), limit)
        self.pressure = Pressure(self.target_engine, limits, job.resume_depth_percent, job.batch_size)
        self.even_if_paused = False  # `sync`/`migrate --even-if-paused`

    def set_rate(self, rate: float | None) -> None:
        """Caps this process's batches of the job at `rate` messages a second (a Spark task gets
        its share of the job's max_rate)."""
        self.pace = Pace(rate)
        base = self.configured
        self.rated = base.model_copy(update={"batch_size": rate_batch(base.batch_size, rate)}) if rate else base
        self.job = self.rated

    def size_batch(self, room: int | None) -> None:
        """The next pass's batch: the rate's, cut to `room` rows (back-pressure's, Pressure.room).
        Set between passes only: a pass reads its size once and keeps it."""
        if room is None or room >= self.rated.batch_size:
            self.job = self.rated
        else:
            self.job = self.rated.model_copy(update={"batch_size": room})

    def may_go(self) -> str | None:
        """None, or why the job's next batch must wait: an operator paused it, or a destination
        queue is too deep. A change of the hold is written for `status` and the page to read."""
        steering = self.steering()
        if steering.paused and not self.even_if_paused:
            return steering.paused_line()
        if steering.held is not None and self.pressure.held is None:
            # A hold another process set (the last one, which ended or was killed while held, or
            # one that ran the job while this one stood by) is this one's until the queues fall
            # below the low-water mark, as it would have been had that process gone on. Not only
            # at a process's first look: a `run` that takes its job back took no part in the hold.
            self.pressure.adopt(steering.held, steering.held_since)
        held = self.pressure.check()
        if (held is None) != (steering.held is None) and self.kept(self.state.steering.table):
            self.state.steering.set_held(self.target_engine, self.job.name, held)
        return None if held is None else f"job {self.job.name!r} held: {held}"

    def message_id(self, source: Source, row: SourceRow) -> uuid.UUID:
        return message_id_for(source.system, self.database, source.queue, source.ledger_key(row))

    def ledger_lookup(self, tconn: sa.Connection, source: Source, keys: Sequence[Any]) -> dict[Any, str]:
        """source key -> outcome, for those of `keys` already in the ledger."""
        texts = [str(k) for k in keys]
        known = self.state.known(tconn, self.origins[source.queue], texts, ranged=source.cursor == "monotonic")
        return {k: known[t] for k, t in zip(keys, texts) if t in known}

    def delivered(self, tconn: sa.Connection, queue: str) -> list[tuple[str, str, str | None]]:
        """(key, message id, target table or None) of what the ledger has as delivered by this
        job from `queue`: its entries, and for increasing keys the range bits (their ids made
        again; a range keeps no target)."""
        source, origin, job = self.sources[queue], self.origins[queue], self.job.name
        l = self.state.ledger
        mine = (l.c.origin == origin, l.c.job == job, l.c.outcome == "delivered")
        if source.cursor != "monotonic":
            return [tuple(r) for r in tconn.execute(sa.select(l.c.source_key, l.c.message_id, l.c.target).where(*mine))]
        keys = [str(k) for k, outcome in self.state.recorded_keys(tconn, job, origin) if outcome == "delivered"]
        targets = dict(tconn.execute(sa.select(l.c.source_key, l.c.target).where(*mine)).all())
        ids = message_ids(source.system, self.database, queue, keys)
        return [(k, str(mid), targets.get(k)) for k, mid in zip(keys, ids)]

    def check(self) -> None:
        """Both databases answer, source tables look right, checkpoints exist; a clear error if not."""
        job = self.job
        try:
            with self.source_engine.connect() as conn:
                for source in self.sources.values():
                    source.check_schema(conn)
        except sa_exc.SQLAlchemyError as e:
            raise describe(e, job.source.connection, self.source_url) from None
        except SourceSchemaError as e:  # named by its connection, as every database error is
            raise SourceSchemaError(f"database {job.source.connection!r} ({mask_url(self.source_url)}): {e}") from None
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
                # A range ledger in place is no proof that this job's NGinn queues were folded.
                ranges = self.state.ranges.table
                ranged = [q for q, s in self.sources.items() if s.cursor == "monotonic"]
                in_place = bool(ranged) and sa.inspect(tconn).has_table(ranges.name, schema=ranges.schema)
                late = [q for q in ranged if in_place and (fresh_fold_left(tconn, ranges.schema)
                                                           or unfolded(tconn, self.state, self.origins[q]))]
            if late:
                raise TargetSchemaError(
                    f"the ledger in {self.job.target.connection!r} keeps messages of {', '.join(map(repr, late))} "
                    f"(job {self.job.name!r}) as entries that no range holds (made by an earlier qbridge: the range "
                    "ledger was created beside them, or folded without these queues); stop every qbridge process "
                    "using it and run `qbridge init -c CONFIG` once to fold them")
            self._ledger_checked = True

    def givebacks_kept(self, conn: sa.Connection | None = None) -> bool:
        """Whether the target has qbridge_givebacks (made by `init` since issue 28): a ledger
        without it has never had anything given back, and passes need not look (kept())."""
        return self.kept(self.state.givebacks, conn)

    def kept(self, table: sa.Table, conn: sa.Connection | None = None) -> bool:
        """Whether the target has `table`, one of the state tables later versions of `init` add.
        Found, it is taken as there for good; missing, it is looked for again after
        KEPT_RECHECK_SECONDS: an operator runs `init` beside a running process (whose pauses,
        give-backs and units in flight it must then see), and a miss costs one catalog query.
        `conn`: the caller's transaction, in which a missing table is looked for every time, on
        that connection (a pass asks under its checkpoint lock whether a rollback owes rows: a
        stale miss there would read them as processed, and a second connection to a SQLite
        target would wait on the pass's own write lock)."""
        now = time.monotonic()
        seen = self._kept.get(table.name)
        if seen is True:
            return True
        if conn is not None:
            found = sa.inspect(conn).has_table(table.name, schema=table.schema)
        elif seen is None or now - seen >= self.kept_recheck_seconds:
            with self.target_engine.connect() as tconn:
                found = sa.inspect(tconn).has_table(table.name, schema=table.schema)
        else:
            return False
        self._kept[table.name] = True if found else now
        return found

    def inflight_kept(self) -> bool:
        """Whether keys in flight can be recorded and read; a move-mode Spark unit needs them."""
        return self.kept(self.state.inflight.table)

    def steering(self) -> Steering:
        """Whether an operator paused the job, or back-pressure holds it (bridge.ledger.steering)."""
        try:
            if not self.kept(self.state.steering.table):
                return Steering(self.job.name)
            with reading(self.target_engine) as tconn:
                return self.state.steering.read(tconn, [self.job.name])[self.job.name]
        except sa_exc.SQLAlchemyError as e:
            raise describe(e, self.job.target.connection, self.target_url) from None

    def fenced(self, tconn: sa.Connection) -> None:
        """The last statement of every transaction that writes the job's books (bridge.ledger.fence)."""
        if self.fence is not None:
            self.fence.check(tconn)

    def _prepare(self, queue: str, give_back: bool = True) -> None:
        """`give_back`: False for a caller that gives back what is owed itself, and counts it."""
        self.check_ledger()
        if queue not in self._ready:
            self.state.ensure_checkpoint(self.target_engine, self.job.name, queue)
            self._ready.add(queue)
        # Rows a killed move-mode rollback still owes the legacy side are given back before
        # anything reads the queue (a process's first pass, a migration's planning): read while
        # owed, a row would be taken as processed. Later rollbacks are caught under the pass's lock.
        if give_back and queue in self.owed_queues:
            giveback.finish(self, queue)
            self.owed_queues.discard(queue)

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
