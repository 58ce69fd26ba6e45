"""What every `qbridge` command's module shares: the consoles and the job runners of a config."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from bridge.config import Config, load_config
from bridge.pipeline.loop import JobRunner

# No markup: what qbridge prints holds TOML section names and legacy values ("add one to [routes]"),
# which Rich's markup would take for tags and drop, in a table cell as in a line.
out = Console(width=None if sys.stdout.isatty() else 160, markup=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160, markup=False)


def runners_of(args: argparse.Namespace) -> tuple[Config, list[JobRunner]]:
    """The config and a runner per job it selects (`--job`, or all)."""
    from bridge.pipeline import gc_policy

    config = load_config(args.config)
    runners = [JobRunner(config, job) for job in config.select(getattr(args, "job", None))]
    gc_policy.for_batches()
    return config, runners
