"""The Spark engine of `qbridge migrate`: plans work units on the driver, runs them as tasks.

It owns no transform logic: each task calls `JobRunner.run_range` / `run_keys`, the same
batch code path `sync --once` runs. Exactly once under task retries, speculative copies and
re-runs after a killed driver comes from the ledger (keyed by the deterministic message id and
written in the target transaction of each batch), not from Spark: a unit that runs twice finds
its messages already in the ledger. Only when every unit of a queue has succeeded does the
driver move that queue's checkpoint past the planned keys, keeping the ids no row had as gaps;
then one in-process drain re-reads those gaps and picks up rows that arrived meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from rich.console import Console

from bridge import faults, tracing
from bridge.config import Config
from bridge.errors import BridgeError, LockLost, MigrationFailed
from bridge.ledger.fence import Fence
from bridge.ledger.gaps import Gap
from bridge.pipeline import gc_policy, logcontext
from bridge.pipeline.loop import JobRunner, PassStats, RangeResult, drain_progress
from bridge.pipeline.planner_stats import LedgerStats

# spark_context, stop_spark, local_slots and _jvm are imported from here by tests and bench/migrate.py too.
from bridge.pipeline.spark_context import TASK_ATTEMPTS, _jvm, local_slots, spark_context, stop_spark  # noqa: F401
from bridge.pipeline.spark_progress import execute
from bridge.pipeline.stats import where_the_time_went
from bridge.retry import with_backoff

log = logging.getLogger("qbridge.migrate")

MAX_UNIT_ROWS = 50_000  # a retried unit re-reads at most this many rows
UNITS_PER_SLOT = 4  # enough units that a slow one does not leave task slots idle at the end


@dataclass(frozen=True)
class WorkUnit:
    """One task: the rows of one queue with after < key <= upto, or (scan sources) these keys."""

    index: int
    job: str
    queue: str
    rows: int  # planned, for progress
    after: Any = None  # an id (monotonic sources) or a sort tuple (scan sources' slices)
    upto: Any = None
    keys: tuple[Any, ...] | None = None
    sliced: bool = False  # a scan source's slice: the keys sorted after `after`, up to `upto` (None: to the end)
    rate: float | None = None  # this task's share of the job's max_rate (messages a second)
    trace: str | None = None  # the driver's span as a `traceparent`: the task's span is its child


@dataclass
class QueuePlan:
    runner: JobRunner
    queue: str
    high: int | None  # the last planned key (monotonic sources)
    units: int = 0
    rows: int = 0


def unit_size(backlog: int, batch_size: int, slots: int) -> int:
    """Rows per unit: a few units per task slot, never under one batch nor over MAX_UNIT_ROWS."""
    per = math.ceil(backlog / max(1, slots * UNITS_PER_SLOT)) if backlog else batch_size
    return max(batch_size, min(MAX_UNIT_ROWS, per))


def plan_queue(runner: JobRunner, queue: str, size: int, first_index: int) -> tuple[QueuePlan, list[WorkUnit]]:
    """Cuts the queue's keys every `size` keys (the database numbers them; no rows are read)."""
    source = runner.sources[queue]
    job = runner.job.name
    with runner.target_engine.connect() as tconn:
        cp = runner.state.read_checkpoints(tconn, job)[queue]
    plan = QueuePlan(runner, queue, cp.high)
    units: list[WorkUnit] = []
    with runner.source_engine.connect() as sconn:
        if source.cursor == "queue":
            pass  # consumed as read: the closing in-process pass drains it, skip-locked
        elif source.cursor == "scan":
            # Slices between sort tuples the database picks: the driver holds boundaries, never keys.
            lower: tuple[Any, ...] | None = None
            for bound in source.slice_boundaries(sconn, size):
                units.append(WorkUnit(first_index + len(units), job, queue, size, after=lower, upto=bound, sliced=True))
                lower = bound
            units.append(WorkUnit(first_index + len(units), job, queue, size, after=lower, upto=None, sliced=True))
        else:
            # The last key first: rows inserted while the boundaries are read land beyond it and
            # are left to the closing pass.
            last = source.max_key(sconn)
            if last is not None and (cp.high is None or last > cp.high):
                after = cp.high
                for key in source.key_boundaries(sconn, cp.high, size):
                    if key > last:
                        break
                    units.append(WorkUnit(first_index + len(units), job, queue, size, after=after, upto=key))
                    after = key
                if after is None or after < last:
                    rest = source.count_after(sconn, after) if after is not None else size
                    units.append(WorkUnit(first_index + len(units), job, queue, rest, after=after, upto=last))
                plan.high = last
    plan.units = len(units)
    plan.rows = sum(u.rows for u in units)
    return plan, units


def _count(runner: JobRunner, source: Any) -> int:
    with runner.source_engine.connect() as sconn:
        return source.count_keys(sconn)


def finish_queue(plan: QueuePlan, gaps: list[Gap]) -> None:
    """Every unit of the queue succeeded: move its checkpoint past the planned keys and keep
    the ids no unit found as gaps, so rows that commit late there are still read; fold the
    totals its units' batches added."""
    runner, queue = plan.runner, plan.queue

    def move() -> None:
        with runner.target_engine.begin() as tconn:
            cp = runner.state.lock_checkpoint(tconn, runner.job.name, queue)
            if plan.high is not None and (cp.high is None or cp.high < plan.high):
                cp.high = plan.high
            cp.gaps = sorted(set(cp.gaps) | set(gaps), key=lambda g: (g.lo, g.hi, g.since))
            runner.state.save_checkpoint(tconn, cp)
            runner.state.totals.fold(tconn, runner.job.name, queue, runner.origins[queue])  # the units' rows, one per batch
            # The plan assumed this process held the job throughout: a rollback since (under
            # another's lock) lowered the checkpoint below rows it withdrew, not to be raised again.
            runner.fenced(tconn)

    with_backoff(move, f"job {runner.job.name} queue {queue}: saving the checkpoint")


# -- executor side ---------------------------------------------------------------------------
_RUNNERS: dict[str, JobRunner] = {}


def run_unit(config: Config, unit: WorkUnit, fences: dict[str, tuple[int | None, str, str | None]] | None = None,
             even_if_paused: frozenset[str] = frozenset()) -> tuple[int, PassStats, list[Gap]]:
    """One task. Python workers are reused between tasks, so engines are built once per worker.
    `fences`: job -> (epoch, holder, why unfenced) of the driver's job locks, which every batch
    checks; `even_if_paused`: the jobs `migrate --even-if-paused` runs although paused."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None:
        logcontext.for_spark_task()
    faults.attempt = ctx.attemptNumber() if ctx is not None else None
    runner = _RUNNERS.get(unit.job)
    if runner is None:
        runner = _RUNNERS[unit.job] = JobRunner(config, config.job(unit.job))
        gc_policy.for_batches()
    if runner.pace.rate != unit.rate:
        runner.set_rate(unit.rate)
    runner.even_if_paused = unit.job in even_if_paused
    fence = (fences or {}).get(unit.job)
    runner.fence = None if fence is None else Fence(runner.state.jobs, unit.job, *fence)
    with logcontext.about(unit.job, unit.queue):
        try:
            with tracing.span("qbridge.unit", parent=unit.trace, job=unit.job, queue=unit.queue, unit=unit.index,
                              attempt=faults.attempt) as s:
                if unit.sliced:
                    result: RangeResult = runner.run_slice(unit.queue, unit.after, unit.upto)
                elif unit.keys is not None:
                    result = runner.run_keys(unit.queue, list(unit.keys))
                else:
                    assert unit.upto is not None
                    result = runner.run_range(unit.queue, unit.after, unit.upto)
                tracing.counts(s, result.stats)
            tracing.flush()  # a Python worker may be stopped before the SDK's thread sends them
        except Exception as e:
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()
            what = f"keys {unit.keys[0]}..{unit.keys[-1]}" if unit.keys else f"{'slice' if unit.sliced else 'ids'} {unit.after}..{unit.upto}"
            # Spark retries the task; what its batches committed stays in the ledger.
            log.warning("job=%s queue=%s %s: attempt %d failed: %s: %s", unit.job, unit.queue, what,
                        (faults.attempt or 0) + 1, type(e).__name__, reason[0] if reason else "")
            raise
    return unit.index, result.stats, result.gaps


# -- driver side (the JVM itself: pipeline/spark_context.py) -----------------------------------


def run_spark(config: Config, runners: list[JobRunner], console: Console, master: str | None,
              unit_rows: int | None = None, attempts: int = 6) -> list[PassStats]:
    """Plans every queue of every job, runs the units on Spark, then finishes each queue; one
    span (`qbridge.migrate`) over it all, the parent of every task's span and closing drain."""
    with tracing.span("qbridge.migrate", jobs=",".join(r.job.name for r in runners), master=master) as s:
        totals = _run_spark(config, runners, console, master, unit_rows, attempts)
        s.set_attribute("qbridge.read", sum(t.read for t in totals))
        s.set_attribute("qbridge.delivered", sum(t.delivered for t in totals))
        return totals


def _run_spark(config: Config, runners: list[JobRunner], console: Console, master: str | None,
               unit_rows: int | None, attempts: int) -> list[PassStats]:
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per closed gateway connection
    # The JVM takes seconds to start: let it while the tables are checked and the units planned.
    starting: dict[str, Any] = {}

    began = time.monotonic()

    def start() -> None:
        try:
            starting["spark"] = spark_context(master)
            starting["ready"] = time.monotonic() - began
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which re-raises it
            starting["error"] = e

    launcher = threading.Thread(target=start, name="qbridge-spark-start", daemon=True)
    launcher.start()
    try:
        for runner in runners:
            name = runner.job.name
            with logcontext.about(name):  # the retries' lines are this job's
                with_backoff(runner.check, f"job {name}: checking tables", attempts=attempts)
                with_backoff(runner.sync_subscriptions, f"job {name}: subscriptions", attempts=attempts)
        local = local_slots(master)
        if local is not None:
            plans, units = _plan(runners, unit_rows, attempts, local)
    except BaseException:
        launcher.join()
        if "spark" in starting:  # a bad table or an unreachable database: do not leave the JVM up
            stop_spark(starting["spark"])
        raise
    launcher.join()
    if "error" in starting:
        raise starting["error"]
    sc = starting["spark"]
    # Once the units are done, Spark stops alongside the queues' closing passes, which need only
    # the databases (a stop takes ~50 ms, but seconds when the JVM dumps its class-data archive).
    stopper = threading.Thread(target=stop_spark, args=(sc,), name="qbridge-spark-stop", daemon=True)
    try:
        if local is None:  # a cluster: plan for the task slots it has
            plans, units = _plan(runners, unit_rows, attempts, max(1, int(sc.defaultParallelism)))
        sc.setLogLevel("ERROR")
        if sc.uiWebUrl and logcontext.chosen_format() == "json":  # a log pipeline reads only JSON lines
            log.info("Spark UI: %s  (master %s)", sc.uiWebUrl, sc.master)
        elif sc.uiWebUrl:
            console.print(f"Spark UI: {sc.uiWebUrl}  (master {sc.master})", markup=False, highlight=False)
        planned = time.monotonic() - began
        slots = sc.defaultParallelism
        totals = _run(config, plans, units, console, sc, attempts, units_done=stopper.start)
        stopper.join()
        where_the_time_went(starting.get("ready", planned), planned, time.monotonic() - began, totals, slots)
        return totals
    finally:
        if stopper.ident is None:
            stop_spark(sc)
        else:
            stopper.join()


def _plan(runners: list[JobRunner], unit_rows: int | None, attempts: int, slots: int) -> tuple[list[QueuePlan], list[WorkUnit]]:
    from bridge.pipeline.waiting import backlog

    planning = time.monotonic()
    plans: list[QueuePlan] = []
    units: list[WorkUnit] = []
    for runner in runners:
        counts = with_backoff(partial(backlog, runner), f"job {runner.job.name}: counting rows", attempts=attempts)
        for queue, n in counts.items():
            source = runner.sources[queue]
            if source.cursor == "scan":
                if n == 0:
                    plans.append(QueuePlan(runner, queue, None))
                    continue
                # Slices cover every key (the ledger skips delivered ones in the task): size them by all.
                n = with_backoff(partial(_count, runner, source), f"job {runner.job.name} queue {queue}: counting keys", attempts=attempts)
            size = unit_rows or unit_size(n, runner.job.batch_size, slots)
            plan, queue_units = with_backoff(partial(plan_queue, runner, queue, size, len(units)),
                                             f"job {runner.job.name} queue {queue}: planning", attempts=attempts)
            plans.append(plan)
            units.extend(queue_units)
    rates = {r.job.name: r.configured.rate_per_second for r in runners}
    # A job's max_rate shared out over the task slots, which may all run its units at once.
    units = [dataclasses.replace(u, rate=rate / slots) if (rate := rates[u.job]) else u for u in units]
    log.info("planned %d units over %d queues (%d rows) in %.1fs", len(units), len(plans), sum(p.rows for p in plans),
             time.monotonic() - planning)
    return plans, units


def _run(config: Config, plans: list[QueuePlan], units: list[WorkUnit], console: Console, sc: Any,
         attempts: int, units_done: Any = lambda: None) -> list[PassStats]:
    started = time.monotonic()
    fences = {p.runner.job.name: (p.runner.fence.epoch, p.runner.fence.holder, p.runner.fence.missing)
              for p in plans if p.runner.fence is not None}
    stats = LedgerStats(plans)
    overridden = frozenset(p.runner.job.name for p in plans if p.runner.even_if_paused)
    parent = tracing.traceparent()
    if parent:
        units = [dataclasses.replace(u, trace=parent) for u in units]
    try:
        results = execute(sc, units, lambda u: run_unit(config, u, fences, overridden), console,
                          stats.units_completed) if units else []
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a task's failure, said in one line
        raise _task_error(e) from None
    spark_seconds = time.monotonic() - started
    units_done()
    stats.refresh()  # the closing passes walk every scan key against the ledger the units filled
    log.info("Spark ran %d units in %.1fs", len(units), spark_seconds)

    by_queue: dict[tuple[str, str], list[tuple[PassStats, list[Gap]]]] = {}
    unit_of = {u.index: u for u in units}
    for index, unit_stats, unit_gaps in results:
        u = unit_of[index]
        by_queue.setdefault((u.job, u.queue), []).append((unit_stats, unit_gaps))
    totals: list[PassStats] = []
    for plan in plans:
        name = plan.runner.job.name
        total = PassStats(f"{name}/{plan.queue}")
        gaps: list[Gap] = []
        for unit_stats, unit_gaps in by_queue.get((name, plan.queue), []):
            total.add(unit_stats)
            gaps.extend(unit_gaps)
        total.seconds = spark_seconds if plan.units else 0.0
        finish_queue(plan, gaps)
        # The same pass `sync --once` runs: re-reads the gaps, takes rows that arrived meanwhile.
        # Counted pass by pass: a retry after progress starts a new drain, whose total lacks the
        # passes of the attempts before it.
        tail = PassStats(plan.queue)
        drained = with_backoff(partial(plan.runner.drain, plan.queue, tail.add), f"job {name} queue {plan.queue}",
                               attempts=attempts, progress=partial(drain_progress, plan.runner))
        if drained.waiting:  # paused or held after the units: what is left waits for the next sync or run
            log.warning("queue %s not drained to the end: %s", plan.queue, drained.waiting)
            tail.waiting = drained.waiting
        total.add(tail)
        total.gaps_open = tail.gaps_open
        totals.append(total)
    return totals


def _task_error(e: BaseException) -> BaseException:
    """Spark wraps a task's exception in a page of JVM trace; keep the Python error's last line."""
    if isinstance(e, BridgeError):
        return e
    text = str(e)
    lost = re.search(r"LockLost: (.*)", text)
    if lost:  # the driver's job lock was lost: every attempt failed at its first commit
        return LockLost(lost.group(1).strip())
    python_lines = [ln.strip() for ln in text.splitlines() if re.match(r"^\s*[\w.]+(Error|Exception)\b.*:", ln)]
    reason = python_lines[-1] if python_lines else text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return MigrationFailed(
        f"a Spark task failed {TASK_ATTEMPTS} times and the migration stopped: {reason}. Nothing is lost or doubled: "
        "committed batches are in the ledger, and re-running `qbridge migrate` continues from there"
    )
