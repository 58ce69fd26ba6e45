"""`qbridge init`, `verify`, `status` and `ledger prune`: the tables a config needs and the books
of its jobs, printed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from rich.table import Table

from bridge.commands.common import err, out, runners_of
from bridge.config import load_config
from bridge.db import reading
from bridge.pipeline.loop import JobRunner


def cmd_init(args: argparse.Namespace) -> int:
    from bridge.lifecycle import init

    config = load_config(args.config)
    plans = init.plan(config, config.select(args.job))
    for p in plans:
        if args.print_sql:
            for line in init.sql_for_dba(p):
                out.print(line, markup=False, highlight=False)
            continue
        say = lambda line: err.print(line, markup=False, highlight=False)
        upgrades = ((init.convert_ledger, "converted the ledger's {:,} entries to the (origin, source key) layout"),
                    (init.add_ledger_totals, "counted the ledger's {:,} entries into per-queue totals (qbridge_totals)"),
                    (init.fold_ranges, "folded the ledger's {:,} NGinn entries into ranges (qbridge_ledger_ranges)"),
                    (init.group_quarantine, "grouped {:,} quarantined messages by their reasons (qbridge quarantine groups)"))
        for upgrade, done in upgrades:
            n = upgrade(p, say)
            if n is not None:
                out.print(f"{p.connection}: " + done.format(n), markup=False, highlight=False)
        created, existing = init.create_missing(p)
        if p.has_state:
            from bridge.db import engine_for
            from bridge.ledger.giveback import unclaimed, unclaimed_advice
            from bridge.ledger.state import State

            for j, q, n in unclaimed(engine_for(p.url), State(p.schema), config.jobs):
                err.print(f"warning: {unclaimed_advice(j, q, n)}", markup=False, highlight=False)
        added = [e for e in existing if "(index" in e]
        out.print(f"{p.connection}: created {len(created)} table(s){': ' + ', '.join(created) if created else ''}; "
                  f"{len(existing)} already existed and were left alone{' but for ' + ', '.join(added) if added else ''}",
                  markup=False, highlight=False)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from bridge.lifecycle.verify import verify

    config, runners = runners_of(args)
    books = [verify(r, deep=args.deep) for r in runners]
    owed = unclaimed_givebacks(config, runners)
    balanced = all(b.balanced for b in books) and not owed
    if args.json:
        sys.stdout.write(orjson.dumps({"balanced": balanced, "jobs": [b.to_json() for b in books],
                                       "unclaimed_givebacks": [{"job": j, "queue": q, "rows": n, "advice": a}
                                                               for j, q, n, a in owed]}).decode() + "\n")
    else:
        t = Table(title="qbridge verify")
        for col in ("job", "queue", "source rows", "delivered", "skipped", "quarantined", "pending", "missing", "backlog", "balanced"):
            t.add_column(col, justify="left" if col in ("job", "queue") else "right")
        for b in books:
            for q in b.queues:
                t.add_row(b.job, q.queue, str(q.source_rows), str(q.delivered), str(q.skipped), str(q.quarantined),
                          str(q.pending), str(q.missing), str(q.backlog), "yes" if q.balanced else "NO")
        out.print(t)
        for b in books:
            for q in b.queues:
                if q.missing_keys:
                    out.print(f"job {b.job} queue {q.queue}: missing source keys {', '.join(q.missing_keys)}", markup=False)
                for rule, n in sorted(q.skipped_by_rule.items()):
                    out.print(f"job {b.job} queue {q.queue}: skipped {n} by rule: {rule}", markup=False)
                if q.deep is not None:
                    d = q.deep
                    out.print(f"job {b.job} queue {q.queue}: deep check compared {d['compared']} delivered messages with "
                              f"their source rows: {d['matched']} match, {d['mismatched']} differ; {d['consumed']} already "
                              f"consumed from the target" + (f"; {d['moved']} consumed from the source by move mode, "
                                                              "nothing left there to compare" if d["moved"] else ""),
                              markup=False)
                    if d["mismatched_keys"]:
                        out.print(f"  differing source keys: {', '.join(d['mismatched_keys'])}", markup=False)
            for s in b.unroutable_subscriptions:
                out.print(f"job {b.job}: subscription not migrated: {s['endpoint']} -> {s['topic']} ({s['reason']})", markup=False)
        for *_, advice in owed:
            out.print(f"NOT BALANCED: {advice}", markup=False, highlight=False)
    return 0 if balanced else 1


def unclaimed_givebacks(config: Any, runners: list[JobRunner]) -> list[tuple[str, str, int, str]]:
    """Owed give-backs no job of the config can finish, per target state schema, with the advice."""
    from bridge.ledger.giveback import unclaimed, unclaimed_advice

    out, seen = [], set()
    for r in runners:
        where = (r.job.target.connection, r.state.givebacks.schema)
        if where in seen:
            continue
        seen.add(where)
        out += [(j, q, n, unclaimed_advice(j, q, n)) for j, q, n in unclaimed(r.target_engine, r.state, config.jobs)]
    return out


def cmd_status(args: argparse.Namespace) -> int:
    from bridge.lifecycle.verify import status

    _, runners = runners_of(args)
    rows = [status(r) for r in runners]
    if args.history:
        for runner, row in zip(runners, rows):
            row["steering_history"] = steering_history(runner, args.history)
    if args.json:
        sys.stdout.write(orjson.dumps({"jobs": rows}).decode() + "\n")
        return 0
    t = Table(title="qbridge status")
    for col in ("job", "mode", "state", "last run", "rows moved", "lag", "backlog", "quarantined"):
        t.add_column(col, overflow="fold")
    for r in rows:
        lag = "-" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}s"
        backlog = "?" if r["backlog"] is None else str(r["backlog"])
        t.add_row(r["job"], r["mode"], state_of(r), r["last_run"] or "never", str(r["rows_moved"]), lag, backlog,
                  str(r["quarantined"]))
    out.print(t)
    for r in rows:
        s = r["steering"]
        if s["paused"]:
            out.print(f"job {r['job']}: paused by {s['paused_by']} at {s['paused_at']}: {s['why']}", markup=False)
    for r in rows:
        if r["source_error"]:
            out.print(f"job {r['job']}: legacy database unreachable, backlog unknown: {r['source_error']}", markup=False)
    for r in rows:
        if args.history:
            h = Table(title=f"job {r['job']}: steering history, newest first")
            for col in ("at (UTC)", "action", "by", "why", "detail"):
                h.add_column(col, overflow="fold")  # folded, never cut: a detail names message ids
            for a in r["steering_history"]:
                h.add_row(a["at"], a["action"], a["actor"], a["why"] or "", a["detail"] or "")
            out.print(h)
    return 0


def steering_history(runner, limit: int) -> list[dict]:
    """The job's newest `limit` steering actions ([] on a target without the table: nothing was steered)."""
    book = runner.state.steering
    with reading(runner.target_engine) as conn:
        if not book.present(conn):
            return []
        return [{"at": a["at"].strftime("%Y-%m-%dT%H:%M:%SZ"), "action": a["action"], "actor": a["actor"], "why": a["why"],
                 "detail": a["detail"]} for a in book.history(conn, runner.job.name, limit)]


def state_of(job: dict) -> str:
    """One word or phrase for a job's state (`status --json`'s): running, paused, or held, failing
    or stopped and why."""
    if job["state"] in ("held", "failing", "stopped"):
        return f"{job['state']}: {job['state_reason']}"
    return job["state"]


def cmd_ledger(args: argparse.Namespace) -> int:
    from bridge.lifecycle.prune import prune

    _, runners = runners_of(args)
    results = [p for r in runners for p in prune(r, dry_run=args.dry_run)]
    if args.json:
        sys.stdout.write(orjson.dumps({"dry_run": args.dry_run, "queues": [p.as_dict() for p in results]}).decode() + "\n")
        return 0
    t = Table(title="qbridge ledger prune" + (" (dry run: nothing removed)" if args.dry_run else ""))
    for col in ("job", "queue", "older than retention", "would remove" if args.dry_run else "removed", "source row still there"):
        t.add_column(col, justify="left" if col in ("job", "queue") else "right")
    for p in results:
        t.add_row(p.job, p.queue, str(p.looked_at), str(p.removed), str(p.still_in_source))
    out.print(t)
    return 0
