"""`qbridge pause` and `qbridge resume`: one job stopped and started at runtime, for every
process that runs it (bridge.ledger.steering), and how `sync` and `migrate` honour a pause."""

from __future__ import annotations

import argparse
import logging

import orjson

from bridge.commands.common import out, runners_of
from bridge.errors import UsageError
from bridge.lifecycle.quarantine import operator
from bridge.pipeline.logcontext import about
from bridge.pipeline.loop import JobRunner

log = logging.getLogger("qbridge.steer")


def _one_job(args: argparse.Namespace) -> JobRunner:
    _, runners = runners_of(args)
    if args.job is None and len(runners) > 1:
        raise UsageError(f"say which job: --job NAME (this config has {', '.join(r.job.name for r in runners)})")
    return runners[0]


def _by(args: argparse.Namespace) -> str:
    """Who, for the audit trail: --by, else the login name (as `quarantine` says it)."""
    return (args.by or "").strip() or operator()


def cmd_pause(args: argparse.Namespace) -> int:
    runner = _one_job(args)
    before = runner.state.steering.set_paused(runner.target_engine, runner.job.name, True, _by(args), args.why)
    was = f" (it was already paused by {before.paused_by}: {before.why})" if before.paused else ""
    _say(args, runner, f"job {runner.job.name!r} paused{was}; a batch in flight commits, and no process starts another "
                       "until `qbridge resume`")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    runner = _one_job(args)
    before = runner.state.steering.set_paused(runner.target_engine, runner.job.name, False, _by(args), args.why)
    _say(args, runner, f"job {runner.job.name!r} resumed" + ("" if before.paused else " (it was not paused)"))
    return 0


def _say(args: argparse.Namespace, runner: JobRunner, line: str) -> None:
    if args.json:
        out.print(orjson.dumps({"job": runner.job.name, **runner.steering().as_json()}).decode(), markup=False, highlight=False)
    else:
        out.print(line, markup=False, highlight=False)


def unpaused(runners: list[JobRunner], even_if_paused: bool, attempts: int) -> list[JobRunner]:
    """The runners whose job is not paused, each paused one skipped with one line saying who
    paused it, when and why; `even_if_paused` runs them all, and says so. A database that does
    not answer is waited for as every other step of `sync` and `migrate` does."""
    from bridge.retry import with_backoff

    keep = []
    for r in runners:
        with about(r.job.name):  # its retries' and skip's log lines are the job's
            steering = with_backoff(r.steering, f"job {r.job.name}: reading whether it is paused", attempts=attempts)
            if steering.paused and not even_if_paused:
                log.warning("%s; skipped (`--even-if-paused` runs it anyway)", steering.paused_line())
                continue
            if steering.paused:
                log.warning("%s; running it anyway (--even-if-paused)", steering.paused_line())
                r.even_if_paused = True
        keep.append(r)
    return keep
