"""The `qbridge` command: demo, init, migrate, sync, verify, status (contract in GUIDE.md)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ContextManager

import orjson
from rich.table import Table
from sqlalchemy import exc as sa_exc

from bridge.commands.common import err, out, runners_of
from bridge.config import load_config
from bridge.lifecycle.blob_inspect import INSPECTORS
from bridge.errors import BridgeError, UsageError
from bridge.pipeline.loop import JobRunner
from bridge.pipeline.stats import summary_table
from bridge.commands.quarantine import quarantine_command

# Piped output (CI logs, `| less`) gets room for the summary tables instead of 80 columns.


LOCK_WAIT = 30.0  # seconds `sync` and `migrate` wait for a job's lock


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qbridge", description="Moves legacy queue messages into NServiceBus SQL-transport tables, exactly once.")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log lines on stderr (default WARNING; sync and run use INFO)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help_: str, config: bool = True, job: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, description=help_)
        if config:
            c.add_argument("-c", "--config", required=True, help="config file (TOML)")
        if job:
            c.add_argument("--job", help="only this job (default: every job in the config)")
        return c

    d = cmd("demo", "build SQLite legacy databases with sample data, migrate them into an NServiceBus-shaped SQLite target, print what moved", config=False, job=False)
    d.add_argument("--dir", help="keep the demo databases and config here (default: a temporary directory)")
    dc = cmd("discover", "list what a legacy database holds that qbridge can migrate (queues, counts, types seen)", config=False, job=False)
    dc.add_argument("url", help="the legacy database's SQLAlchemy URL (a password in it is never printed)")
    dc.add_argument("--schema", help="the schema the legacy tables are in (default: the database's default)")
    dc.add_argument("--write", metavar="DIR", help="write a starter config.toml and mapping per system there")
    dc.add_argument("--sample", type=int, default=200, metavar="N", help="messages decoded per queue for the types seen (default 200)")
    dc.add_argument("--json", action="store_true", help="one JSON document on stdout")
    pv = cmd("preview", "what migrate would do, read and mapped as it would, writing nothing anywhere (SELECT rights suffice)")
    pv.add_argument("--json", action="store_true", help="one JSON document on stdout")
    pv.add_argument("--fail-on", choices=["quarantine"], help="quarantine: exit 1 when anything would be quarantined (a gate before a cutover)")
    rb = cmd("rollback", "withdraw what a job delivered that no endpoint has taken yet; the ledger forgets it, so a later migrate or sync delivers it again once")
    rb.add_argument("--queue", help="only this legacy queue of the job")
    rb.add_argument("--dry-run", action="store_true", help="say what would be withdrawn and what cannot be, change nothing")
    rb.add_argument("--print-sql", action="store_true", help="print the statements a batch runs, for a DBA, and do nothing")
    rb.add_argument("--json", action="store_true", help="one JSON document on stdout")
    rb.add_argument("--lock-wait", type=float, default=0.0, metavar="SECONDS", help="how long to wait for the job's lock (default 0: refuse at once, naming the holder)")
    rb.add_argument("--retries", type=int, default=5, help=argparse.SUPPRESS)
    i = cmd("init", "create the target queue, delayed, subscription, error and state tables that are missing")
    i.add_argument("--print-sql", action="store_true", help="print the DDL for a DBA instead of running it")
    m = cmd("migrate", "bulk migration of everything the legacy queues hold now")
    m.add_argument("--master", help="Spark master URL: local[*] (the default: one task slot more than the CPUs qbridge may use, as "
                   "tasks wait on the databases), local[N], spark://host:7077, ... Under spark-submit, the master "
                   "spark-submit was given")
    m.add_argument("--unit-rows", type=int, metavar="N", help="rows per Spark task (default: a few tasks per task slot, at most 50,000 rows each)")
    m.add_argument("--retries", type=int, default=6, help="attempts per batch when a database is unreachable or a deadlock occurs, waiting 0.1, 1, 2, 4, 8 s; each batch that commits starts afresh (default 6)")
    s = cmd("sync", "one incremental pass over every queue of the job(s)")
    s.add_argument("--once", action="store_true", required=True, help="one pass, then exit (the scheduler is `qbridge run`)")
    s.add_argument("--retries", type=int, default=6, help="attempts per batch when a database is unreachable or a deadlock occurs, waiting 0.1, 1, 2, 4, 8 s; each batch that commits starts afresh (default 6)")
    for c in (m, s):
        c.add_argument("--lock-wait", type=float, default=LOCK_WAIT, metavar="SECONDS",
                       help=f"how long to wait for a job another qbridge process holds (a `qbridge run`), then exit 1 "
                            f"naming the holder (default {LOCK_WAIT:g})")
    r = cmd("run", "the scheduler: every job on its schedule until SIGTERM/SIGINT (then the batch in flight commits and it exits 0)")
    r.add_argument("--listen", metavar="HOST:PORT", help="serve the status page on http://HOST:PORT/ and Prometheus metrics on /metrics (also [service] listen "
                   "in the config); an address other than loopback needs QBRIDGE_TOKEN")
    v = cmd("verify", "reconcile source rows with delivered / skipped / quarantined; exit 1 if they do not balance")
    v.add_argument("--json", action="store_true", help="one JSON document on stdout")
    v.add_argument("--deep", action="store_true", help="also compare a content hash of every delivered message still in the target with its source row")
    st = cmd("status", "per job: last run, rows moved, lag, backlog, quarantine count")
    st.add_argument("--json", action="store_true", help="one JSON document on stdout")
    qa = cmd("quarantine", "list, show, replay or discard quarantined messages; history shows what was done to them")
    qa.add_argument("action", choices=["list", "show", "replay", "discard", "history"],
                    help="list: one line per message; show: everything kept of it; replay: decode and map the kept row "
                         "again with the current config and deliver it once; discard: give it up, with --why; "
                         "history: the audit trail of replays and discards")
    qa.add_argument("--id", nargs="+", dest="ids", metavar="ID", help="only these message ids (from `list`)")
    qa.add_argument("--all", action="store_true", help="every quarantined message (the default for list and history)")
    qa.add_argument("--why", metavar="TEXT", help="why (kept in the audit trail; say it for discard)")
    qa.add_argument("--by", metavar="NAME", help="who, for the audit trail (default: the login name)")
    qa.add_argument("--json", action="store_true", help="one JSON document on stdout")
    qa.add_argument("--raw", action="store_true", help="show: only the kept raw row, as JSON (to edit for replay --with)")
    qa.add_argument("--with", dest="edited", metavar="FILE", help="replay: from this edited copy of the raw row "
                    "(JSON, from `show --raw`; one --id); the key and identity columns cannot change")
    lg = cmd("ledger", "the ledger's upkeep: `prune` removes entries older than ledger_retention whose source rows are gone")
    lg.add_argument("action", choices=["prune"], help="prune: scan sources' and reverse jobs' entries that can no longer matter")
    lg.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    lg.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ins = cmd("inspect", "decode legacy blobs saved to files and print what qbridge reads from them", config=False, job=False)
    ins.add_argument("kind", choices=sorted(INSPECTORS), help="what the file holds")
    ins.add_argument("files", nargs="+", metavar="FILE", help="the blob (several for biztalk-part: the fragments in order)")
    ins.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    level = args.log_level
    if args.command in ("sync", "migrate", "run") and level == "WARNING":
        level = "INFO"
    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    handler: Callable[[argparse.Namespace], int] = (quarantine_command if args.command == "quarantine"
                                                     else globals()[f"cmd_{args.command}"])
    try:
        return handler(args)
    except BridgeError as e:
        err.print(f"qbridge: {_label(e)}: {e}", markup=False, highlight=False)
        return e.exit_code
    except sa_exc.SQLAlchemyError as e:
        first = str(getattr(e, "orig", None) or e).strip().splitlines()
        err.print(f"qbridge: database error: {first[0] if first else type(e).__name__}", markup=False, highlight=False)
        return 1
    except KeyboardInterrupt:
        err.print("qbridge: interrupted")
        return 130


def _label(e: BridgeError) -> str:
    from bridge.errors import ConfigError, DriverMissing

    if isinstance(e, DriverMissing):
        return "missing driver"
    return "config error" if isinstance(e, ConfigError) or e.exit_code == 2 else "error"


def cmd_discover(args: argparse.Namespace) -> int:
    from bridge.commands.discover import discover_command

    return discover_command(args)


def cmd_preview(args: argparse.Namespace) -> int:
    from bridge.commands.preview import preview_command

    return preview_command(args)


def cmd_rollback(args: argparse.Namespace) -> int:
    from bridge.commands.rollback import rollback_command

    return rollback_command(args, _holding)


def cmd_init(args: argparse.Namespace) -> int:
    from bridge.lifecycle import init as provision
    config = load_config(args.config)
    plans = provision.plan(config, config.select(args.job))
    for p in plans:
        if args.print_sql:
            for line in provision.sql_for_dba(p):
                out.print(line, markup=False, highlight=False)
            continue
        say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731
        upgrades = ((provision.convert_ledger, "converted the ledger's {:,} entries to the (origin, source key) layout"),
                    (provision.add_ledger_totals, "counted the ledger's {:,} entries into per-queue totals (qbridge_totals)"),
                    (provision.fold_ranges, "folded the ledger's {:,} NGinn entries into ranges (qbridge_ledger_ranges)"))
        for upgrade, done in upgrades:
            n = upgrade(p, say)
            if n is not None:
                out.print(f"{p.connection}: " + done.format(n), markup=False, highlight=False)
        created, existing = provision.create_missing(p)
        if p.has_state:
            from bridge.ledger.giveback import unclaimed, unclaimed_advice
            from bridge.db import engine_for
            from bridge.ledger.state import State

            for j, q, n in unclaimed(engine_for(p.url), State(p.schema), config.jobs):
                err.print(f"warning: {unclaimed_advice(j, q, n)}", markup=False, highlight=False)
        added = [e for e in existing if "(index" in e]
        out.print(f"{p.connection}: created {len(created)} table(s){': ' + ', '.join(created) if created else ''}; "
                  f"{len(existing)} already existed and were left alone{' but for ' + ', '.join(added) if added else ''}",
                  markup=False, highlight=False)
    return 0


def _holding(args: argparse.Namespace, runners: list[JobRunner]) -> ContextManager[None]:
    """The jobs' locks, which `qbridge run` takes too, for the whole command."""
    from bridge.ledger.joblock import holding, identity

    if args.lock_wait < 0:
        raise UsageError("--lock-wait must be 0 or more seconds")
    return _fenced(runners, holding([(r.target_engine, r.state.checkpoint.schema, r.job.name, r.job.target.connection)
                                     for r in runners], args.lock_wait, identity(args.command), attempts=args.retries))


@contextmanager
def _fenced(runners: list[JobRunner], held: ContextManager[dict[str, Any]]) -> Iterator[None]:
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
    with _holding(args, runners):
        out.print(summary_table(run_inprocess(runners, console=err, attempts=args.retries)))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from bridge.pipeline.spark import run_spark

    config, runners = runners_of(args)
    if args.unit_rows is not None and args.unit_rows < 1:
        raise UsageError("--unit-rows must be at least 1")
    master = args.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        master = "local[*]"
    with _holding(args, runners):
        out.print(summary_table(run_spark(config, runners, console=err, master=master, unit_rows=args.unit_rows,
                                          attempts=args.retries)))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from bridge.service.scheduler import run_until_stopped

    config, runners = runners_of(args)
    listen = args.listen or (config.service.listen if config.service else None)
    if listen:
        from bridge.listen import parse_listen

        parse_listen(listen)  # a bad address is a usage error before anything starts
    return run_until_stopped(runners, listen, str(args.config))


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
                              f"consumed from the target", markup=False)
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
    if args.json:
        sys.stdout.write(orjson.dumps({"jobs": rows}).decode() + "\n")
        return 0
    t = Table(title="qbridge status")
    for col in ("job", "mode", "last run", "rows moved", "lag", "backlog", "quarantined"):
        t.add_column(col)
    for r in rows:
        lag = "-" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}s"
        backlog = "?" if r["backlog"] is None else str(r["backlog"])
        t.add_row(r["job"], r["mode"], r["last_run"] or "never", str(r["rows_moved"]), lag, backlog, str(r["quarantined"]))
    out.print(t)
    for r in rows:
        if r["source_error"]:
            out.print(f"job {r['job']}: legacy database unreachable, backlog unknown: {r['source_error']}", markup=False)
    return 0


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


def cmd_inspect(args: argparse.Namespace) -> int:
    from bridge.errors import UnreadableBlob

    try:
        blobs = [open(f, "rb").read() for f in args.files]
    except OSError as e:
        raise UnreadableBlob(f"{e.filename}: {e.strerror}") from None
    try:
        result = INSPECTORS[args.kind](blobs)
    except ValueError as e:
        raise UnreadableBlob(f"{', '.join(args.files)}: {e}") from None
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.print_json(data=result)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from bridge.demo.run import run_demo

    return run_demo(args.dir, out)


if __name__ == "__main__":
    sys.exit(main())
