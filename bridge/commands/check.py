"""`qbridge check`, and `migrate --check` / `run --check`: bridge.lifecycle.check's probes, printed."""

from __future__ import annotations

import argparse
import sys

import orjson
from rich.table import Table

from bridge.commands.common import err, out, runners_of
from bridge.config import Config
from bridge.lifecycle.check import Checker
from bridge.lifecycle.check_probes import check
from bridge.pipeline.loop import JobRunner


def check_command(args: argparse.Namespace) -> int:
    config, runners = runners_of(args)
    checker = check(config, runners, args.config)
    if args.json:
        sys.stdout.write(orjson.dumps({"ok": checker.ok, "probes": [p.as_dict() for p in checker.probes]}).decode() + "\n")
    else:
        show(checker)
    return 0 if checker.ok else 1


def checked_first(args: argparse.Namespace, config: Config) -> bool:
    """`--check` of migrate and run: the probes on runners of their own (nothing they learn
    inside a rolled-back transaction is kept); False (after printing them) when one failed."""
    if not getattr(args, "check", False):
        return True
    checker = check(config, [JobRunner(config, job) for job in config.select(args.job)], args.config)
    if checker.ok:
        err.print(f"check: {len(checker.probes)} probe(s) passed", markup=False, highlight=False)
        return True
    show(checker, failed_only=True)
    err.print("check failed: nothing was moved; fix what is named above (qbridge check -c CONFIG shows every probe)",
              markup=False, highlight=False)
    return False


def show(checker: Checker, failed_only: bool = False) -> None:
    t = Table(title="qbridge check", show_lines=False)
    for name in ("job", "where", "what", "result", "what the database said / found", "fix"):
        t.add_column(name, overflow="fold")
    for p in checker.probes:
        if failed_only and p.ok:
            continue
        t.add_row(p.job, p.side, p.what, "ok" if p.ok else "FAILED", p.said, p.fix)
    out.print(t)
    failed = sum(not p.ok for p in checker.probes)
    out.print(f"{len(checker.probes) - failed} passed, {failed} failed; every probe ran in a transaction that was "
              "rolled back", markup=False, highlight=False)
