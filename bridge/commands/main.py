"""The `qbridge` command line: its parser, and each command handed to the module of its family
(contract in GUIDE.md and docs/commands.md)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from sqlalchemy import exc as sa_exc

from bridge.commands.common import err, out
from bridge.commands.jobs import LOCK_WAIT
from bridge.commands.logs import log_format
from bridge.errors import BridgeError
from bridge.lifecycle.blob_inspect import INSPECTORS
from bridge.pipeline.logcontext import configure

# Each command's handler, "module:function", imported when that command runs.
HANDLERS: dict[str, str] = {
    "demo": "bridge.commands.main:cmd_demo",
    "discover": "bridge.commands.discover:discover_command",
    "preview": "bridge.commands.preview:preview_command",
    "check": "bridge.commands.check:check_command",
    "map": "bridge.commands.mapone:cmd_map",
    "init": "bridge.commands.books:cmd_init",
    "migrate": "bridge.commands.jobs:cmd_migrate",
    "sync": "bridge.commands.jobs:cmd_sync",
    "run": "bridge.commands.jobs:cmd_run",
    "verify": "bridge.commands.books:cmd_verify",
    "status": "bridge.commands.books:cmd_status",
    "ledger": "bridge.commands.books:cmd_ledger",
    "rollback": "bridge.commands.rollback:rollback_command",
    "quarantine": "bridge.commands.quarantine:quarantine_command",
    "inspect": "bridge.commands.inspect:cmd_inspect",
    "pause": "bridge.commands.steering:cmd_pause",
    "resume": "bridge.commands.steering:cmd_resume",
    "reload": "bridge.commands.reload:cmd_reload",
}


def _version() -> str:
    """The installed distribution's version (pyproject.toml's), as pip knows it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("qbridge")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed: pip install -e .)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qbridge", description="Moves legacy queue messages into NServiceBus SQL-transport tables, exactly once.")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log lines on stderr (default WARNING; sync and run use INFO)")
    p.add_argument("--log-format", choices=["text", "json"], help="text (the default, for a terminal) or json: one JSON object "
                   "a line with time, level, logger, job, queue, trace and span ids, message (also QBRIDGE_LOG_FORMAT)")
    p.add_argument("--version", action="version", version=f"qbridge {_version()}")
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
    ck = cmd("check", "run every statement the jobs run on their own connections, each in a transaction that is rolled "
             "back: reads, locking reads, consumes, writes into each queue with the books, the receive, the locks; "
             "exit 1 naming the GRANT or step that fixes what failed")
    ck.add_argument("--json", action="store_true", help="one JSON document on stdout (each probe with its statements, "
                    "as run here and as SQL Server would run them)")
    mp = cmd("map", "what one legacy row becomes: its route, headers, body and TTBR, or its skip or quarantine, and the rules behind it (writes nothing)")
    mp.add_argument("--queue", required=True, help="the legacy queue of the job the row is in")
    mp.add_argument("--key", required=True, help="the row's source key, as `quarantine list` and preview show it")
    mp.add_argument("--json", action="store_true", help="one JSON document on stdout")
    rb = cmd("rollback", "withdraw what a job delivered that no endpoint has taken yet; the ledger forgets it, so a later migrate or sync delivers it again once")
    rb.add_argument("--queue", help="only this legacy queue of the job")
    rb.add_argument("--dry-run", action="store_true", help="say what would be withdrawn and what cannot be, change nothing")
    rb.add_argument("--print-sql", action="store_true", help="print the statements a batch runs, for a DBA, and do nothing")
    rb.add_argument("--json", action="store_true", help="one JSON document on stdout")
    rb.add_argument("--yes", "-y", action="store_true", help="withdraw without asking (without a terminal, rollback "
                    "refuses unless given this)")
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
    r = cmd("run", "the scheduler: every job on its schedule until SIGTERM/SIGINT (then the batch in flight commits and it exits 0)")
    for c in (m, r):
        c.add_argument("--check", action="store_true", help="run `qbridge check` first, and stop (exit 1) if anything fails")
    for c in (m, s):
        c.add_argument("--batch-size", type=int, metavar="N",
                       help="rows a transaction for this run, in place of each job's batch_size (the config, which "
                            "`qbridge run` keeps using, is left as it is): 5,000 to 20,000 drains a backlog about twice "
                            "as fast as the default 1,000 (docs/configuration.md#choosing-batch_size); 2,000 at most "
                            "where either side is SQL Server")
        c.add_argument("--even-if-paused", action="store_true", help="run a job an operator paused (`qbridge pause`) "
                       "all the same; by default a paused job is skipped with a line saying who paused it, when and why")
        c.add_argument("--lock-wait", type=float, default=LOCK_WAIT, metavar="SECONDS",
                       help=f"how long to wait for a job another qbridge process holds (a `qbridge run`), then exit 1 "
                            f"naming the holder (default {LOCK_WAIT:g})")
    r.add_argument("--listen", metavar="HOST:PORT", help="serve the status page on http://HOST:PORT/ and Prometheus metrics on /metrics (also [service] listen "
                   "in the config); an address other than loopback needs QBRIDGE_TOKEN")
    v = cmd("verify", "reconcile source rows with delivered / skipped / quarantined; exit 1 if they do not balance")
    v.add_argument("--json", action="store_true", help="one JSON document on stdout")
    v.add_argument("--deep", action="store_true", help="also compare a content hash of every delivered message still in the target with its source row")
    st = cmd("status", "per job: last run, rows moved, lag, backlog, quarantine count")
    st.add_argument("--json", action="store_true", help="one JSON document on stdout")
    st.add_argument("--history", nargs="?", type=int, const=50, metavar="N",
                    help="also the N newest steering actions of each job (default 50): pauses, resumes and the status "
                         "page's group replays and discards, with who, when and why (qbridge_steering_audit)")
    qa = cmd("quarantine", "list, show, replay or discard quarantined messages; history shows what was done to them")
    qa.add_argument("action", choices=["list", "groups", "show", "replay", "discard", "history"],
                    help="list: one line per message; groups: one line per failure group (its reason with ids, numbers, "
                         "quoted values and times masked, per job and queue); show: everything kept of it; replay: decode "
                         "and map the kept row again with the current config and deliver it once; discard: give it up, "
                         "with --why; history: the audit trail of replays and discards")
    qa.add_argument("--id", nargs="+", dest="ids", metavar="ID", help="only these message ids (from `list`)")
    qa.add_argument("--group", metavar="G", help="only this failure group (from `groups`)")
    qa.add_argument("--queue", metavar="Q", help="only messages from this legacy queue")
    qa.add_argument("--type", metavar="TEXT", help="only messages whose kept legacy row holds this text (a type name)")
    qa.add_argument("--since", metavar="WHEN", help="only messages quarantined since then: a time (UTC unless it says "
                    "otherwise) or how long ago (30m, 2h, 1d)")
    qa.add_argument("--all", action="store_true", help="every quarantined message (the default for list and history)")
    qa.add_argument("--even-if-paused", action="store_true", help="replay: deliver a paused job's messages all the "
                    "same; by default a replay of a paused job is refused, saying who paused it and why")
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
    for name, help_ in (("pause", ("pause one job at runtime, for every process that runs it (`qbridge run`, its standbys, "
                                   "sync, migrate): a batch in flight commits, and no other starts until `qbridge resume`")),
                        ("resume", "resume a paused job: every process running it goes on from its next batch")):
        ps = cmd(name, help_)
        ps.add_argument("--why", metavar="TEXT", required=name == "pause", help="why (shown wherever the job shows as paused, "
                        "and kept in the audit trail)")
        ps.add_argument("--by", metavar="NAME", help="who, for the audit trail (default: the login name)")
        ps.add_argument("--json", action="store_true", help="the job's steering state after it, as one JSON document")
    cmd("reload", "check the config, then have every `qbridge run` of it on this host re-read it and its mappings "
                  "(SIGHUP): each job takes a valid change from its next batch; an invalid one is refused and the "
                  "running config stays in force")
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
    module, _, name = HANDLERS[args.command].partition(":")
    try:
        configure(level, log_format(args.log_format))
        handler: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
        return handler(args)
    except BridgeError as e:
        err.print(f"qbridge: {_label(e)}: {e}", markup=False, highlight=False, soft_wrap=True)  # one line a log can grep
        return e.exit_code
    except sa_exc.SQLAlchemyError as e:
        from bridge.db import waiting_cannot_fix

        first = str(getattr(e, "orig", None) or e).strip().splitlines()
        err.print(f"qbridge: database error: {first[0] if first else type(e).__name__}", markup=False, highlight=False, soft_wrap=True)
        return 2 if waiting_cannot_fix(e) else 1
    except KeyboardInterrupt:
        err.print("qbridge: interrupted")
        return 130
    finally:
        from bridge import tracing

        tracing.flush()  # the spans the SDK's thread has not sent yet


def _label(e: BridgeError) -> str:
    from bridge.errors import ConfigError, DriverMissing, UsageError

    if isinstance(e, DriverMissing):
        return "missing driver"
    return "config error" if isinstance(e, (ConfigError, UsageError)) else "error"


def cmd_demo(args: argparse.Namespace) -> int:
    from bridge.demo.run import run_demo

    return run_demo(args.dir, out)


if __name__ == "__main__":
    sys.exit(main())
