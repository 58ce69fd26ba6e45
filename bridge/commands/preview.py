"""`qbridge preview -c CONFIG [--job NAME] [--json] [--fail-on quarantine]`: the output of bridge.lifecycle.preview."""

from __future__ import annotations

import argparse
import sys

import orjson
from rich.table import Table

from bridge.commands.common import out, runners_of
from bridge.db import sqlite_file
from bridge.errors import SourceSchemaError
from bridge.lifecycle.init import missing_tables
from bridge.lifecycle.preview import JobPreview, preview


def missing_files(config, jobs) -> list[str]:
    """The legacy SQLite databases the jobs read whose file is not there, each with its connection."""
    out = []
    for job in jobs:
        for role, name in (() if job.reverse else (("legacy", job.source.connection),)):  # a proxy queue's: made by init
            path = sqlite_file(config.connections[name])
            if path is not None and not path.exists():
                line = f"connection {name!r} ({role} of job {job.name!r}): no SQLite database at {path}"
                if line not in out:
                    out.append(line)
    return out


def preview_command(args: argparse.Namespace) -> int:
    config, runners = runners_of(args)
    absent = missing_files(config, [r.job for r in runners])
    if absent:  # a target's is made by `init`, and listed with the tables it would create
        raise SourceSchemaError("preview reads the databases and writes nothing, not even a new file:\n  "
                                + "\n  ".join(absent))
    previews = [preview(r, missing_tables(config, r.job), config) for r in runners]
    if args.json:
        sys.stdout.write(orjson.dumps({"jobs": [p.to_json() for p in previews]}).decode() + "\n")
    else:
        for p in previews:
            _print(p)
    quarantined = sum(q.quarantine_count for p in previews for q in p.queues)
    # A queue that could not be read is a problem unless `init` would create its table (a proxy queue).
    unread = [q for p in previews for q in p.queues if q.problem and not any(m.endswith(f": {q.queue}") for m in p.missing_tables)]
    return 1 if unread or (args.fail_on == "quarantine" and quarantined) else 0


def _print(p: JobPreview) -> None:
    t = Table(title=f"qbridge preview: job {p.job} (nothing written)")
    for col in ("queue", "rows", "by legacy state", "would go to", "skipped by rule", "already delivered", "quarantined"):
        t.add_column(col)
    for q in p.queues:
        t.add_row(q.queue + (" (head)" if q.head_only else ""), f"{q.rows:,}",
                  ", ".join(f"{s} {n:,}" for s, n in q.states.most_common()),
                  ", ".join(f"{name} {n:,}" for name, n in q.tables.most_common()),
                  ", ".join(f"{rule} {n:,}" for rule, n in q.skipped.most_common()),
                  f"{q.already:,}", f"{q.quarantine_count:,}")
    out.print(t)
    say = lambda line: out.print(line, markup=False, highlight=False)
    for q in p.queues:
        if q.problem:
            say(f"{q.queue}: not read: {q.problem}")
        for reason, r in sorted(q.quarantined.items(), key=lambda kv: -kv[1]["count"]):
            say(f"{q.queue}: would quarantine {r['count']:,} ({reason}), e.g. keys {', '.join(r['examples'])}")
        for rule, n in sorted(q.rules.items()):
            say(f"{q.queue}: rule {rule} applies to {n:,} rows, e.g. key {q.rule_examples[rule]}")
        for name, n in q.untyped.most_common(20):
            say(f"{q.queue}: type {name!r} ({n:,} rows) has no [types] entry: passed through as it is")
    for s in p.subscriptions:
        say(f"subscription: {s['endpoint']} receives {s['topic']} -> {s['to']} subscribes {s['as']}")
    for s in p.unroutable:
        say(f"subscription that cannot be migrated: {s.get('endpoint')} / {s.get('topic')}: {s.get('reason')}")
    for name in p.missing_tables:
        say(f"missing table (qbridge init creates it): {name}")
    rate = p.rows / p.seconds if p.seconds else 0
    say(f"read and mapped {p.rows:,} rows in {p.seconds:.1f} s ({rate:,.0f} rows/s); {p.to_write:,} rows to write; "
        f"migrate: about {p.rows / rate if rate else 0:,.0f} s at this rate before its writes, which Spark spreads over its tasks")
