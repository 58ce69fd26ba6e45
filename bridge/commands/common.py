"""What every `qbridge` command's module shares: the consoles and the job runners of a config."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from bridge.config import MSSQL_BATCH_MAX, Config, JobConfig, load_config, mssql_side
from bridge.errors import UsageError
from bridge.pipeline.loop import JobRunner

# No markup: what qbridge prints holds TOML section names and legacy values ("add one to [routes]"),
# which Rich's markup would take for tags and drop, in a table cell as in a line.
out = Console(width=None if sys.stdout.isatty() else 160, markup=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160, markup=False)


def runners_of(args: argparse.Namespace) -> tuple[Config, list[JobRunner]]:
    """The config and a runner per job it selects (`--job`, or all)."""
    from bridge.pipeline import gc_policy

    config = load_config(args.config)
    if getattr(args, "batch_size", None) is not None:
        config.jobs = with_batch_size(config, args.batch_size, {job.name for job in config.select(args.job)})
    runners = [JobRunner(config, job) for job in config.select(getattr(args, "job", None))]
    gc_policy.for_batches()
    return config, runners


def with_batch_size(config: Config, size: int, names: set[str]) -> list[JobConfig]:
    """The config's jobs, those named `names` (the command's) with `--batch-size` in place of their
    batch_size, for this command only, under the limits a config's own batch_size has."""
    limits = JobConfig.model_fields["batch_size"].metadata  # the config's own bounds: one place says them
    most = min(m.le for m in limits if hasattr(m, "le"))
    if not 1 <= size <= most:
        raise UsageError(f"--batch-size {size}: give 1 to {most:,} rows a transaction")
    for job in config.jobs:
        if job.name in names and size > MSSQL_BATCH_MAX and (side := mssql_side(config.connections, job)):
            raise UsageError(f"--batch-size {size}: job {job.name!r}'s {side} is SQL Server, which takes at most "
                             f"{MSSQL_BATCH_MAX:,} rows in one statement; give {MSSQL_BATCH_MAX:,} or fewer"
                             + ("" if len(names) == 1 else " (or run the other jobs with --job)"))
    return [job.model_copy(update={"batch_size": size}) if job.name in names else job for job in config.jobs]
