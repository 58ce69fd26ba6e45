"""The in-process engine (`sync --once`, and `migrate` until Spark): the framework loop with a progress bar."""

from __future__ import annotations

import logging
from functools import partial

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bridge.pipeline.logcontext import about
from bridge.pipeline.loop import JobRunner, PassStats, drain_progress
from bridge.pipeline.waiting import backlog
from bridge.retry import with_backoff

log = logging.getLogger("qbridge.sync")


def run_inprocess(runners: list[JobRunner], console: Console, attempts: int = 6) -> list[PassStats]:
    """Every queue of every job until no full batch is left; retryable failures back off."""
    plans = []
    for runner in runners:
        name = runner.job.name
        with about(name):  # the retries' lines are this job's
            with_backoff(runner.check, f"job {name}: checking tables", attempts=attempts)
            with_backoff(runner.sync_subscriptions, f"job {name}: subscriptions", attempts=attempts)
            # The backlog sizes the progress bars only: where none is drawn (a scheduler, a pipe) no
            # count is made, which for a scan source is a walk of every key against the ledger.
            counts = (with_backoff(partial(backlog, runner), f"job {name}: counting rows", attempts=attempts)
                      if console.is_terminal else dict.fromkeys(runner.sources, 0))
            plans.append((runner, counts))
    totals: list[PassStats] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
        for runner, counts in plans:
            for queue, n in counts.items():
                task = progress.add_task(f"{runner.job.name}/{queue}", total=max(n, 1))
                done = PassStats(f"{runner.job.name}/{queue}")

                def on_pass(stats: PassStats, done: PassStats = done, task: TaskID = task) -> None:
                    done.add(stats)
                    progress.update(task, advance=stats.read)

                # Each pass commits, so a retry after a failure resumes where it stopped.
                with about(runner.job.name, queue):
                    drained = with_backoff(partial(runner.drain, queue, on_pass), f"job {runner.job.name} queue {queue}",
                                           attempts=attempts, progress=partial(drain_progress, runner))
                if drained.waiting:
                    log.info("queue %s not drained: %s", queue, drained.waiting)
                    done.waiting = drained.waiting
                progress.update(task, completed=max(n, done.read, 1))
                totals.append(done)
    return totals
