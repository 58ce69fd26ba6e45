"""Running a migration's units as one Spark job, and showing it move (issue 46.4): a bar of units
and one of rows on a terminal, a line every 10 s without one; Ctrl-C cancels the Spark job and
waits (a few seconds) for its tasks to stop before the caller says what moved.

The job group is set on the thread that submits the job: PySpark keeps a SparkContext's local
properties per Python thread (pinned thread mode), so a group set on another thread names no job,
and `cancelJobGroup` then cancels nothing while the progress bar, which looks the group's jobs up,
stays at 0."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console

from bridge.pipeline.progress_shown import Shown

log = logging.getLogger("qbridge.migrate")

CANCEL_WAIT = 20.0  # seconds Ctrl-C waits for the cancelled tasks' batches to end before it returns


def execute(sc: Any, units: Sequence[Any], work: Callable[[Any], Any], console: Console,
            on_progress: Callable[[int], None] = lambda done: None) -> list[Any]:
    """`work(unit)` for every unit, one partition each, as one Spark job; returns what each gave
    (a unit's result is (index, PassStats, gaps)). `on_progress(units completed)` every half second."""
    group = f"qbridge-{os.getpid()}-{time.time_ns()}"
    rows = sc.accumulator(0)

    def counted(unit: Any) -> Any:
        result = work(unit)
        stats = result[1]
        rows.add(stats.delivered + stats.skipped + stats.quarantined)  # reaches the driver when the task ends
        return result

    rdd = sc.parallelize(list(units), len(units)).map(counted)
    box: dict[str, Any] = {}

    def collect() -> None:
        sc.setJobGroup(group, "qbridge migrate", interruptOnCancel=True)
        try:
            box["results"] = rdd.collect()
        except BaseException as e:  # noqa: BLE001 - re-raised on the driver's main thread
            box["error"] = e

    worker = threading.Thread(target=collect, name="qbridge-spark-collect", daemon=True)
    worker.start()
    planned = sum(u.rows for u in units)
    tracker = sc.statusTracker()
    try:
        with Shown(console, "migrate") as shown:
            while worker.is_alive():
                worker.join(0.5)
                done = completed(tracker, group)
                shown.update("units done", done, len(units))
                shown.update("rows of the units done (about)", rows.value, planned)
                on_progress(done)
            shown.update("units done", len(units) if "results" in box else completed(tracker, group), len(units))
            shown.update("rows of the units done (about)", rows.value, planned)
    except KeyboardInterrupt:
        deadline = time.monotonic() + CANCEL_WAIT
        sc.cancelJobGroup(group)
        worker.join(CANCEL_WAIT)  # the tasks stop at their next batch; what committed stays committed
        # The job ends at its cancellation, its tasks a little later. The caller then stops the
        # context; a task ending after that has its report refused, and Spark logs each refusal
        # as a stack trace on the operator's screen. So the tasks are waited for too.
        while running(tracker, group) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise
    if "error" in box:
        raise box["error"]
    return list(box["results"])


def running(tracker: Any, group: str) -> int:
    """Tasks of the group's jobs still running (a cancelled job's among them, until they end)."""
    return sum(stage.numActiveTasks for stage in _stages(tracker, group))


def completed(tracker: Any, group: str) -> int:
    """Tasks (units) of the group's jobs that have finished."""
    return sum(stage.numCompletedTasks for stage in _stages(tracker, group))


def _stages(tracker: Any, group: str) -> list[Any]:
    """What Spark's status tracker knows of the stages of the group's jobs."""
    stages = []
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info else ():
            stage = tracker.getStageInfo(stage_id)
            if stage:
                stages.append(stage)
    return stages
