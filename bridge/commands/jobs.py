"""`qbridge sync --once`, `qbridge migrate` and `qbridge run`: the commands that move messages,
each holding its jobs' locks (and their fences) for as long as it runs."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from typing import Any

from bridge.commands.check import checked_first
from bridge.commands.common import err, out, runners_of
from bridge.commands.steering import unpaused
from bridge.errors import UsageError
from bridge.pipeline.loop import JobRunner
from bridge.pipeline.stats import summary_table

LOCK_WAIT = 30.0  # seconds `sync` and `migrate` wait for a job's lock


def holding(args: argparse.Namespace, runners: list[JobRunner]) -> ContextManager[None]:
    """The jobs' locks, which `qbridge run` takes too, for the whole command."""
    from bridge.ledger.joblock import holding, identity

    if args.lock_wait < 0:
        raise UsageError("--lock-wait must be 0 or more seconds")
    return fenced(runners, holding([(r.target_engine, r.state.checkpoint.schema, r.job.name, r.job.target.connection)
                                     for r in runners], args.lock_wait, identity(args.command), attempts=args.retries))


@contextmanager
def fenced(runners: list[JobRunner], held: ContextManager[dict[str, Any]]) -> Iterator[None]:
    """Each runner checks its job's fence, taken with the lock, in every transaction it commits."""
    with held as fences:
        for r in runners:
            r.fence = fences.get(r.job.name)
        try:
            yield
        finally:
            for r in runners:
                r.fence = None


def cmd_sync(args: argparse.Namespace) -> int:
    from bridge.pipeline.inprocess import run_inprocess

    _, runners = runners_of(args)
    runners = unpaused(runners, args.even_if_paused, args.retries)
    if not runners:
        return 0
    with holding(args, runners):
        out.print(summary_table(run_inprocess(runners, console=err, attempts=args.retries)))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from bridge.pipeline.spark import run_spark

    config, runners = runners_of(args)
    if args.unit_rows is not None and args.unit_rows < 1:
        raise UsageError("--unit-rows must be at least 1")
    if not checked_first(args, config):
        return 1
    runners = unpaused(runners, args.even_if_paused, args.retries)
    if not runners:
        return 0
    master = args.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        master = "local[*]"
    before = _outcomes(runners)
    try:
        with holding(args, runners):
            out.print(summary_table(run_spark(config, runners, console=err, master=master, unit_rows=args.unit_rows,
                                              attempts=args.retries)))
    except KeyboardInterrupt:  # the Spark job is cancelled and its tasks stopped (bridge.pipeline.spark_progress)
        moved = _outcomes(runners) - before
        said = ", ".join(f"{n:,} {outcome}" for outcome, n in sorted(moved.items())) or "nothing"
        err.print(f"qbridge: migrate interrupted: {said} before the stop, each with its ledger entry. Nothing is lost or "
                  "doubled: `qbridge migrate` again goes on from there (`qbridge status` and `verify` say where the "
                  "queues stand)", markup=False, highlight=False)
        return 130
    return 0


def _outcomes(runners: list[JobRunner]) -> Counter[str]:
    """Messages of these jobs delivered, skipped and quarantined so far, from the ledger's totals."""
    from bridge.ledger.totals import OUTCOMES

    seen: Counter[str] = Counter()
    for r in runners:
        with r.target_engine.connect() as conn:
            for counts in r.state.counts(conn, r.job.name, r.origins.values()).values():
                seen.update({o: counts.get(o, 0) for o in OUTCOMES})
    return seen


def cmd_run(args: argparse.Namespace) -> int:
    from bridge.service.scheduler import run_until_stopped

    hup = threading.Event()
    if hasattr(signal, "SIGHUP"):  # a `qbridge reload` while this starts is kept (by default SIGHUP kills)
        signal.signal(signal.SIGHUP, lambda *_: hup.set())
    config, runners = runners_of(args)
    if not checked_first(args, config):
        return 1
    listen = args.listen or (config.service.listen if config.service else None)
    if listen:
        from bridge.settings_io import parse_listen

        parse_listen(listen)  # a bad address is a usage error before anything starts
    return run_until_stopped(runners, listen, str(args.config), config_path=str(args.config), job=args.job, hup=hup)
