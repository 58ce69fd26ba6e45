"""`qbridge run`: every job of a config on its schedule, for weeks, until SIGTERM/SIGINT.

APScheduler fires each job's trigger; a tick drains every queue of the job through the same
pass as `sync --once`. One instance per job at a time (max_instances=1), missed runs coalesced,
and a session lock in the target database (joblock.py) so that a second `qbridge run` on the
same config stands by and takes a job over when the first one dies.

A retryable failure (database down, deadlock, lock timeout) backs the job off, one log line per
attempt; a job whose tables or mapping are wrong stops with its reason; other jobs run on.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from bridge import tracing
from bridge.db import cause_of, is_retryable, waiting_cannot_fix
from bridge.errors import BridgeError, SetupError
from bridge.ledger import job_state
from bridge.ledger.joblock import IDENTITY, JobLock, LockLost
from bridge.pipeline.lane_imports import import_lane_modules
from bridge.pipeline.logcontext import about
from bridge.pipeline.loop import JobRunner
from bridge.service.reload_diff import changes
from bridge.service.schedules import describe, readiness_allowance, trigger_for

log = logging.getLogger("qbridge.run")

MAX_BACKOFF = 60.0
HEALTH_STALL = 15.0  # seconds the main loop may go without a turn before /healthz says so
PRUNE_LIMIT = 10_000  # ledger entries looked at per queue per pruning round of `qbridge run`


class JobWorker:
    """One job inside `qbridge run`: its lock, its back-off, whether it has stopped for good."""

    def __init__(self, runner: JobRunner, stopping: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.name = runner.job.name
        self.stopping = stopping
        self.lock = JobLock(runner.target_engine, self.name, schema=runner.state.checkpoint.schema,
                            connection=runner.job.target.connection)
        self.clock = clock
        self.failures = 0
        self.retry_at = 0.0
        self.checked = False
        self.standing_by = False
        self.stopped_reason: str | None = None
        # running, failing or stopped, written to the books when it changes (bridge.ledger.job_state)
        self._tell = job_state.Teller(runner.target_engine, runner.state.job_state, self.name, IDENTITY)
        # epoch seconds of the last run without an error, or of its last committed batch: a drain
        # of a long backlog (throttled, say) is a run in progress, not a job that stopped.
        self.last_success: float | None = None
        self.retries: dict[str, int] = {}  # failed runs retried, by error class
        self.last_error: str | None = None  # the first line of the last failure, until a run succeeds
        self.prune_at = 0.0  # when the ledger is next pruned (clock seconds)
        self.waiting: str | None = None  # why the job's last run stopped short: paused, or held
        self.allowance = readiness_allowance(runner.job)
        self.pending: JobRunner | None = None  # built from a reloaded config, taken before the next batch
        # `pending` is set by the main thread (Scheduler.reload) while the tick's thread takes it:
        # taking and clearing it is one step, or a reload landing in between would be cleared unseen.
        self._pending_lock = threading.Lock()

    def offer(self, new: JobRunner | None) -> None:
        """A runner built from a reloaded config, taken before the next batch (None: withdraws one)."""
        with self._pending_lock:
            self.pending = new

    def latest(self) -> JobRunner:
        """The runner of the newest config: the one waiting to be taken, else the one running."""
        return self.pending or self.runner

    def _claim(self) -> JobRunner | None:
        with self._pending_lock:
            new, self.pending = self.pending, None
        return new

    def _take(self, new: JobRunner) -> None:
        old = self.runner
        new.on_batch = old.on_batch
        if new.pace.rate == old.pace.rate:
            new.pace.next_at = old.pace.next_at  # the rate holds across a reload
        new.fence, new.pace.waited = old.fence, old.pace.waited  # the seconds throttled in all only grow
        self.runner = new
        self.checked = False  # its tables and mapping are checked again
        self.stopped_reason = None  # a job stopped on a bad mapping runs again once it is fixed
        self.allowance = readiness_allowance(new.job)

    def tick(self) -> None:
        """One scheduled run: take the lock, drain every queue. Never raises."""
        # The lock, back-off and failure lines carry the job (JSON logs); the first batch span of
        # a run after failed ones says how many (qbridge.retries).
        with about(self.name), tracing.retrying(self.failures):
            self._tick()

    def _tick(self) -> None:
        if self.stopped_reason or self.stopping.is_set() or self.clock() < self.retry_at:
            return
        try:
            if not self.lock.ensure():
                if not self.standing_by:
                    log.info("job=%s another qbridge run holds this job; standing by to take over", self.name)
                    self.standing_by = True
                return
            if self.standing_by:
                log.info("job=%s lock taken over; running", self.name)
                self.standing_by = False
            self.runner.fence = self.lock.fence  # a new epoch whenever the lock was taken anew
            try:
                self._run()
            except LockLost:
                # Its connection was cut: a standby may run the job now. No batch of this one
                # starts until the lock is taken again, and none under way commits once another
                # took it (the fence). Released, so that the next tick takes it, and a new epoch,
                # only if it is free (a lock file removed under it is still "held" here).
                log.warning("job=%s lost its lock (its database connection was cut); another qbridge run may hold "
                            "the job now; standing by", self.name)
                self.lock.release()
                self.runner.fence = None
                self.standing_by = True
                return
            self.last_success = time.time()
            self.last_error = None
            if self.failures:
                log.info("job=%s recovered after %d failed attempt(s)", self.name, self.failures)
            self.failures = 0
            self._tell("running", None)
        except Exception as e:  # noqa: BLE001 - a job's failure must never take the scheduler down
            self._failed(e)

    def _run(self) -> None:
        while True:
            new = self._claim()
            if new is not None:  # a reloaded config, from the next batch on
                self._take(new)
            runner = self.runner
            if not self.checked:
                runner.check()
                runner.sync_subscriptions()
                self.checked = True
            waiting = None
            for queue in runner.sources:
                if self.stopping.is_set():
                    return
                waiting = runner.drain(queue, on_pass=self._passed, should_stop=self._should_yield,
                                       before_pass=self._confirm_lock).waiting
                if waiting is not None or self.pending is not None:
                    break
            if self.pending is None or self.stopping.is_set():
                break
        if waiting != self.waiting:  # one line per change, not one per tick
            if waiting is not None:
                log.info("%s; skipped until that changes", waiting)
            else:
                log.info("job=%s running again (%s)", self.name, self.waiting)
            self.waiting = waiting
        if self.clock() >= self.prune_at and not self.stopping.is_set():
            self._prune()

    def _should_yield(self) -> bool:
        """A drain stops after the batch in flight: the process stops, or a reloaded config is
        waiting (its rate, batch size and mapping then apply from the next batch, not the next tick)."""
        return self.stopping.is_set() or self.pending is not None

    def _passed(self, stats: Any) -> None:
        self.last_success = time.time()  # a committed batch: the job is alive, however long its backlog

    def _prune(self) -> None:
        """Ledger entries that can no longer matter, a bounded number per round (bridge.lifecycle.prune)."""
        from bridge.lifecycle.prune import prune

        every = max(10.0, min(3600.0, self.runner.job.retention_seconds / 10))
        self.prune_at = self.clock() + every
        try:
            rounds = prune(self.runner, limit=PRUNE_LIMIT)
            if any(r.looked_at >= PRUNE_LIMIT for r in rounds):
                # More is waiting: the next round comes after the next drain, not after `every`,
                # so pruning keeps up with any inflow it can (a round is bounded; delivery goes first).
                self.prune_at = self.clock()
        except Exception as e:  # noqa: BLE001 - pruning waits for its next round; moving messages goes on
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()
            log.warning("job=%s pruning the ledger failed (%s); trying again in %.0fs", self.name,
                        reason[0] if reason else type(e).__name__, every)

    def _confirm_lock(self) -> None:
        if not self.lock.still_held():
            raise LockLost(self.name)

    def _failed(self, e: Exception) -> None:
        e = cause_of(e)  # a deadlock, not the savepoint rollback it made fail
        if not isinstance(e, BridgeError) and waiting_cannot_fix(e):  # a table gone, a login refused: stop, say why
            e = SetupError(str(getattr(e, "orig", None) or e).strip())
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()
        reason_line = reason[0] if reason else type(e).__name__
        self.last_error = reason_line if isinstance(e, BridgeError) or is_retryable(e) else f"{type(e).__name__}: {reason_line}"
        if is_retryable(e) or not isinstance(e, BridgeError):
            kind = type(getattr(e, "orig", None) or e).__name__
            self.retries[kind] = self.retries.get(kind, 0) + 1
        if is_retryable(e):
            self.failures += 1
            delay = min(MAX_BACKOFF, 2.0 ** (self.failures - 1))
            self.retry_at = self.clock() + delay
            log.warning("job=%s attempt %d failed (%s); retrying in %.0fs", self.name, self.failures, reason_line, delay)
            self._tell("failing", reason_line)
            if self.lock.held:
                try:
                    self.lock.ensure()  # drops a lock whose connection died with the database
                except Exception:  # noqa: BLE001 - a lock whose check fails is released, whatever failed
                    self.lock.release()
        elif isinstance(e, BridgeError):
            self.stopped_reason = reason_line
            log.error("job=%s stopped: %s (the other jobs keep running; fix it and restart qbridge run)", self.name, "\n".join(reason))
            self._tell("stopped", reason_line)
            self.lock.release()
        else:
            self.failures += 1
            delay = min(MAX_BACKOFF, 2.0 ** (self.failures - 1))
            self.retry_at = self.clock() + delay
            log.exception("job=%s unexpected %s; retrying in %.0fs", self.name, type(e).__name__, delay)
            self._tell("failing", f"{type(e).__name__}: {reason_line}")


class Scheduler:
    """The jobs of one config under one APScheduler."""

    def __init__(self, runners: list[JobRunner]) -> None:
        self.stopping = threading.Event()
        self.workers = [JobWorker(r, self.stopping) for r in runners]
        self.scheduler = BackgroundScheduler(timezone=UTC, job_defaults={
            "max_instances": 1,  # never two runs of one job in this process
            "coalesce": True,  # runs missed while one was busy collapse into one
            "misfire_grace_time": None,
        })

    def start(self) -> None:
        # Before the first ticks run side by side, each importing them (two threads importing pyarrow
        # at once can see it half made).
        import_lane_modules(rules=any(w.runner.mapping.has_rules for w in self.workers))
        now = datetime.now(UTC)
        for w in self.workers:
            self.scheduler.add_job(w.tick, trigger_for(w.runner.job), id=w.name, name=w.name, next_run_time=now)
        self.scheduler.start()
        for w in self.workers:
            log.info("job=%s scheduled (%s)", w.name, describe(w.runner.job))

    def stop(self) -> None:
        """Lets running ticks finish the batch in flight and commit, then releases the locks."""
        self.stopping.set()
        self.scheduler.shutdown(wait=True)
        for w in self.workers:
            w.lock.release()

    def all_stopped(self) -> bool:
        return all(w.stopped_reason for w in self.workers)

    def reload(self, path: str, job: str | None) -> bool:
        """Re-reads the config and its mappings: each job's changes apply from its next batch (its
        next tick takes a runner built from them). An invalid config is refused with its located
        error, and the running one stays in force; so is a change that needs a restart (a job
        added or removed, a job's target database moved: its lock and fence live there)."""
        from bridge.config import load_config

        try:
            config = load_config(path)
            fresh = {j.name: j for j in config.select(job)}
        except BridgeError as e:
            log.error("reload refused, the running config stays in force: %s", e)
            return False
        running = {w.name for w in self.workers}
        if set(fresh) != running:
            log.error("reload refused, the running config stays in force: jobs %s need a restart of qbridge run "
                      "(a reload changes the jobs it runs, not which)",
                      ", ".join(sorted(set(fresh) ^ running)))
            return False
        for w in self.workers:
            old = w.runner
            if config.connections[fresh[w.name].target.connection] != old.target_url:
                log.error("reload refused, the running config stays in force: job %s's target moved (its lock and "
                          "fence live there); restart qbridge run", w.name)
                return False
        built: dict[str, JobRunner] = {}
        for w in self.workers:
            try:
                new = JobRunner(config, fresh[w.name])
            except BridgeError as e:
                log.error("reload refused, the running config stays in force: job %s: %s", w.name, e)
                return False
            if new.state.checkpoint.schema != w.runner.state.checkpoint.schema:
                log.error("reload refused, the running config stays in force: job %s's state schema moved (its lock "
                          "and fence live there); restart qbridge run", w.name)
                return False
            built[w.name] = new
        for w in self.workers:
            latest = w.latest()
            changed = changes(latest.configured, built[w.name].configured, latest.mapping, built[w.name].mapping)
            # Against the newest config, which may still wait to be taken (two reloads before a batch).
            if built[w.name].job.schedule != latest.job.schedule:
                self.scheduler.reschedule_job(w.name, trigger=trigger_for(built[w.name].job))
                log.info("job=%s rescheduled (%s)", w.name, describe(built[w.name].job))
                w.allowance = readiness_allowance(built[w.name].job)
            if w.stopped_reason:  # it ticks no more: it takes the new config now, and runs again
                w.offer(None)
                w._take(built[w.name])
            else:
                w.offer(built[w.name])
            log.info("job=%s config reloaded: %s", w.name,
                     f"{'; '.join(changed)} (applies from its next batch)" if changed else "nothing changed")
        return True


def run_until_stopped(runners: list[JobRunner], listen: str | None = None, title: str = "qbridge run",
                      config_path: str | None = None, job: str | None = None,
                      hup: threading.Event | None = None) -> int:
    """Blocks until SIGTERM or SIGINT; 0 after a clean stop, 1 if every job stopped on an error.
    `listen` (HOST:PORT) serves Prometheus metrics on /metrics and the status page on / meanwhile.
    SIGHUP re-reads `config_path` (Scheduler.reload)."""
    # qbridge logs each batch and catches its ticks' errors; a tick still draining when the next is due is no news
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    scheduler = Scheduler(runners)
    beat = [time.monotonic()]  # the main loop's last turn, for /healthz

    def alive() -> str | None:
        if not scheduler.scheduler.running:
            return "the scheduler is not running"
        quiet = time.monotonic() - beat[0]
        return f"the main loop has not turned for {quiet:.0f}s" if quiet > HEALTH_STALL else None

    server = None
    if listen:
        from bridge.service.metrics import MetricsServer

        server = MetricsServer(listen, scheduler.workers, title, alive)
        server.start()
    wake = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("%s received: finishing the batches in flight", signal.Signals(signum).name)
        wake.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    hup = hup if hup is not None else threading.Event()  # set already: a SIGHUP while starting up
    if config_path is not None and hasattr(signal, "SIGHUP"):
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: hup.set())
    told = False
    try:
        scheduler.start()
        while not wake.wait(1.0):
            beat[0] = time.monotonic()
            if hup.is_set():  # here, not in the handler: a reload connects to databases
                hup.clear()
                log.info("SIGHUP received: reloading %s", config_path)
                scheduler.reload(str(config_path), job)
            if not scheduler.all_stopped():
                told = False
            elif server is None:
                log.error("every job has stopped on an error; exiting")
                scheduler.stop()
                return 1
            elif not told:
                # A listener goes on saying it: exited, the process took the stopped state with it
                # before a scrape could see it (QBridgeJobStopped never fired on a one-job config).
                told = True
                log.error("every job has stopped on an error; /metrics and the status page say so until a "
                          "fixed config is reloaded (SIGHUP) or the process is stopped (then exit 1)")
        stopped = scheduler.all_stopped()
        scheduler.stop()
        log.info("stopped cleanly")
        return 1 if stopped else 0
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if server is not None:
            server.stop()
