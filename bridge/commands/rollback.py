"""`qbridge rollback -c CONFIG --job NAME [--queue Q] [--dry-run] [--print-sql] [--json]`."""

from __future__ import annotations

import argparse
import sys

import orjson
import sqlalchemy as sa
from rich.prompt import Confirm
from rich.table import Table

from bridge.commands.common import err, out, runners_of
from bridge.commands.jobs import holding
from bridge.db import read_only_engine
from bridge.errors import BridgeError, UsageError
from bridge.lifecycle.rollback import Withdrawal, check, rollback, row_key
from bridge.pipeline.loop import JobRunner
from bridge.pipeline.progress_shown import Shown


class Declined(BridgeError):
    """The operator answered no."""


def rollback_command(args: argparse.Namespace) -> int:
    if not args.job:
        raise UsageError("rollback withdraws one job's messages: give --job NAME")
    config, [runner] = runners_of(args)
    check(runner)
    if args.print_sql:
        for line in statements(runner):
            out.print(line, markup=False, highlight=False)
        return 0
    if args.dry_run:
        # No lock and no fence (taking them raises the job's epoch), and read-only connections:
        # a dry run writes nothing anywhere, and runs with a login that can only read.
        runner.target_engine = read_only_engine(runner.target_url)
        try:
            results = rollback(runner, args.queue, dry_run=True, config=config)
        finally:
            runner.target_engine.dispose()
    else:
        if not args.yes:
            _confirm(runner, args.queue)
        with holding(args, [runner]), Shown(err, "withdrawn") as shown:
            results = rollback(runner, args.queue, dry_run=False, config=config, progress=shown.update)
    if args.json:
        sys.stdout.write(orjson.dumps({"dry_run": args.dry_run, "queues": [w.as_dict() for w in results]}).decode() + "\n")
        return 0
    _print(results, args.dry_run)
    return 0


def _confirm(runner: JobRunner, queue: str | None) -> None:
    """A rollback takes messages back off the NServiceBus queues: asked first on a terminal;
    without one (a script, a pipeline), refused unless `--yes` says so."""
    queues = ", ".join([queue] if queue else list(runner.sources))
    what = (f"job {runner.job.name!r} ({queues}): withdraw from the NServiceBus queues every message it delivered that no "
            "endpoint has taken yet; a later sync or migrate delivers them again"
            + (", and the legacy rows move mode consumed are given back" if runner.job.mode == "move" else ""))
    if not sys.stdin.isatty():
        raise UsageError(f"rollback of {what}. Say --yes to go on without a terminal to ask on "
                         "(`--dry-run` first says what it would withdraw); nothing done")
    if not Confirm.ask(f"{what}. Go on?", console=err, default=False):
        raise Declined("nothing done")


def _print(results: list[Withdrawal], dry_run: bool) -> None:
    t = Table(title="qbridge rollback" + (" (dry run: nothing withdrawn)" if dry_run else ""))
    move = any(w.given_back or w.quarantined for w in results)
    for col in ("job/queue", "would withdraw" if dry_run else "withdrawn", "from", "consumed by endpoints (kept)",
                "legacy row consumed (kept)") + (("would give back" if dry_run else "given back to legacy",) if move else ()):
        t.add_column(col)
    for w in results:
        t.add_row(f"{w.job}/{w.queue}", f"{w.withdrawn:,}", ", ".join(f"{n} {c:,}" for n, c in w.by_table.most_common()),
                  f"{w.consumed:,}", f"{w.kept:,}", *((f"{w.given_back:,}",) if move else ()))
    out.print(t)
    for w in results:
        if w.quarantined:
            out.print(f"{w.queue}: {w.quarantined:,} legacy row(s) were gone before they could be given back: their "
                      "messages are in quarantine (`qbridge quarantine list`), from where `replay` delivers them",
                      markup=False, highlight=False)
    for w in results:
        for why, n in w.unsure_why.most_common():
            out.print(f"{w.queue}: {n:,} kept delivered: {why}", markup=False, highlight=False)
    for w in results:
        if w.consumed_ids:
            more = f" (and {w.consumed - len(w.consumed_ids):,} more)" if w.consumed > len(w.consumed_ids) else ""
            out.print(f"{w.queue}: consumed, cannot be withdrawn: {', '.join(w.consumed_ids)}{more}", markup=False,
                      highlight=False)


GIVEN_BACK = {
    "nginn": "UPDATE <queue> SET subqueue = the one it had WHERE id IN (...) AND subqueue = 'X' and last_processed as "
             "move mode left it",
    "openjms": "INSERT INTO messages (where no handle still holds the message) and message_handles, the blob rebuilt "
               "from the delivered row with its JMSMessageID, and INSERT INTO qbridge_giveback_marks (one row per "
               "message; a rerun gives back only what has no mark; deleted once nothing is owed)",
    "biztalk": "INSERT INTO <host>Q (or <host>Q_Suspended) the entry with its uidServiceID and nvcAdditionalInfo, where "
               "the Spool row is still there, and INSERT INTO qbridge_giveback_marks (as for OpenJMS)",
}


def statements(runner) -> list[str]:
    """For a DBA: the statements one batch runs in one transaction, with their parameters named."""
    dialect = runner.target_engine.dialect
    s = runner.state
    job, lines = runner.job, []

    def show(stmt: sa.ClauseElement) -> None:
        lines.append(str(stmt.compile(dialect=dialect)).strip() + ";")

    lines.append(f"-- qbridge rollback of job {job.name!r}: per batch of up to 1,000 delivered messages, one transaction")
    show(sa.select(s.checkpoint).where(s.checkpoint.c.job == job.name).with_for_update())
    for table in runner.target.tables():
        if table.name == "SubscriptionRouting":
            continue
        col = row_key(table)
        show(sa.select(col).where(col.in_([0])).with_for_update().with_hint(table, "WITH (UPDLOCK, ROWLOCK)", "mssql"))
        show(sa.delete(table).where(col.in_([0])))
    show(sa.delete(s.ledger).where(s.ledger.c.origin == 0, s.ledger.c.source_key.in_(["key"])))
    r = s.ranges.table
    show(sa.update(r).where(r.c.origin == sa.bindparam("o_"), r.c.block == sa.bindparam("b_"))
         .values(delivered=sa.bindparam("delivered"), skipped=sa.bindparam("skipped"), quarantined=sa.bindparam("quarantined")))
    show(sa.insert(s.totals.table))
    if job.mode == "move":
        show(sa.insert(s.givebacks))
        lines.append("-- then, per batch, in the legacy database and under the checkpoint lock: the rows given back, "
                     "committed before the qbridge_givebacks rows are deleted: " + GIVEN_BACK.get(job.source.system, ""))
    lines.append("-- the rows to withdraw are those whose QBridge.Source header names this job's queue and whose "
                 "NServiceBus.MessageId is its deterministic id, unprocessed (no NServiceBus.ProcessingEndpoint)")
    return lines
