"""`qbridge discover URL [--schema S] [--write DIR] [--json]`: the output of bridge.lifecycle.discover."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
import sqlalchemy as sa
from rich.table import Table

from bridge.commands.common import err, out
from bridge.db import describe, read_only_engine
from bridge.errors import UsageError
from bridge.lifecycle.discover import discover
from bridge.lifecycle.discover_write import write_starter


def discover_command(args: argparse.Namespace) -> int:
    try:
        url = sa.engine.make_url(args.url)
    except sa.exc.ArgumentError:
        raise UsageError(f"{args.url!r} is not a database URL (e.g. postgresql+psycopg://host/db, sqlite:///legacy.db)") from None
    if args.sample < 0:
        raise UsageError("--sample must be 0 or more")
    engine = read_only_engine(url.render_as_string(hide_password=False))
    try:
        found = discover(engine, args.schema, args.sample)
    except sa.exc.SQLAlchemyError as e:
        raise describe(e, "legacy", url.render_as_string(hide_password=False)) from None
    finally:
        engine.dispose()
    if args.json:
        sys.stdout.write(orjson.dumps(found.to_json()).decode() + "\n")
    else:
        t = Table(title=f"qbridge discover: {found.where}" + (f" (schema {found.schema})" if found.schema else ""))
        for col in ("system", "queue", "kind", "rows by state", "durable consumers", f"types (first {found.sample} decoded)"):
            t.add_column(col)
        for q in found.queues:
            states = ", ".join(f"{s} {n:,}" for s, n in q.states.items()) or "empty"
            types = ", ".join(f"{name} ×{n}" for name, n in q.types.items())
            if q.unreadable:
                types += f"{', ' if types else ''}{q.unreadable} unreadable"
            t.add_row(q.system, q.name, q.kind, states, ", ".join(q.consumers), f"{types} (of {q.sampled})" if q.sampled else "")
        out.print(t)
        for s in found.subscriptions:
            out.print(f"subscription: {s['endpoint']} receives {s['topic']}", markup=False, highlight=False)
        if not found.queues:
            err.print("qbridge: no NGinn queue table, OpenJMS store or BizTalk host found there"
                      + ("" if args.schema else " (is it in another schema? --schema)"), markup=False, highlight=False)
    if args.write:
        if not found.queues:
            raise UsageError("nothing to write a config for: discover found no queue")
        for path in write_starter(found, url, Path(args.write)):
            err.print(f"wrote {path}", markup=False, highlight=False)
        zoned = sorted({q.system for q in found.queues if q.system != "openjms"})
        if zoned:  # every local time would shift by the real offset, silently
            err.print(f"qbridge: check timezone in the config: {' and '.join(zoned)} write local times, and the zone "
                      "their servers run in cannot be read from the database; the config guesses \"UTC\"",
                      markup=False, highlight=False)
    return 0 if found.queues else 1
