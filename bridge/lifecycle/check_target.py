"""The target side of `qbridge check` (bridge.lifecycle.check): qbridge's tables, a write into
each table a job's messages go to with the books, read back by the transport's own receive, and
the job's lock and fence, each in a transaction that is rolled back."""

from __future__ import annotations

import os
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa

from bridge.config import SourceConfig
from bridge.db import sqlite_file
from bridge.ledger import fence
from bridge.ledger.joblock import JobLock, acquire_statement
from bridge.ledger.state import LedgerEntry, Quarantined
from bridge.lifecycle.check import CHECK_JOB, DENIED, PROBE_TEXT, Checker, Need, Recorder, rolled_back, tables_of
from bridge.model import CanonicalMessage, SourceRef, queue_origin
from bridge.pipeline.loop import JobRunner
from bridge.sources.nservicebus import NServiceBusSource
from bridge.targets.base import Skipped
from bridge.targets.envelope import Outgoing
from bridge.timefmt import utcnow


def target_probes(checker: Checker, runner: JobRunner, unwritable: Collection[str] = (), opened: bool = True) -> None:
    from bridge.lifecycle.init import missing_tables

    job, engine, url = runner.job.name, runner.target_engine, runner.target_url

    def books(rec: Recorder) -> str:
        missing = missing_tables(checker.config, runner.job)
        if missing:
            raise MissingTables(f"missing: {', '.join(missing)}; run `qbridge init`")
        return "qbridge's tables and the queues are there"

    if not checker.run(job, "target", "tables", (), books).ok or not opened:
        return
    state_needs = [(url, Need("SELECT, INSERT, UPDATE, DELETE", t)) for t in runner.state.all_tables()]
    for queue, source in runner.sources.items():
        for kind, table_queue, out in _probe_messages(runner, queue):
            label = f"{queue}: write to {table_queue}{'.Delayed' if kind == 'delayed' else ''}"

            def write(rec: Recorder, out: Any = out, kind: str = kind, table_queue: str = table_queue, src: Any = source,
                      queue: str = queue) -> str:
                if runner.job.reverse and unwritable:
                    return "not run: a table it writes keeps no transactions (see transactions)"
                with rolled_back(engine) as conn:
                    runner.target.begin_batch(conn)
                    if isinstance(out, CanonicalMessage):  # a legacy target's rows, made as a batch makes them
                        out = runner.target.envelope(out, frozenset())
                        if isinstance(out, Skipped):
                            return f"not written: the mapping skips a message of an unknown type here ({out.reason})"
                    before = _head(runner, conn, kind, table_queue)
                    with conn.begin_nested():
                        runner.target.write(conn, [out])
                    _record(runner, conn, queue, src, out)
                    conn.execute(runner.state.new_checkpoint(CHECK_JOB, queue))  # a job's first pass makes its row
                    runner.state.lock_checkpoint(conn, CHECK_JOB, queue)
                    said = f"written with a ledger entry, a range row and a quarantined entry; {_read_back_as_endpoint(runner, conn, kind, table_queue, out, before)}"
                rec.extra_mssql += _mssql(runner, kind, table_queue)
                return said

            def write_needs(table_queue: str = table_queue, kind: str = kind) -> list[tuple[str, Need]]:
                return [*_queue_needs(runner, url, kind, table_queue), *state_needs]

            checker.run(job, "target", label, (engine,), write, write_needs)
    _lock_probes(checker, runner)


class MissingTables(Exception):
    pass


def _probe_messages(runner: JobRunner, queue: str) -> list[tuple[str, str, Any]]:
    """(kind, table's queue, what the target writes) for each table the job's messages of `queue` go to."""
    mapping, states = runner.mapping, runner.mapping.states
    actions = {states.ready, states.delayed, states.failed}
    headers = {"QBridge.Check": PROBE_TEXT, "NServiceBus.MessageId": str(uuid.uuid4())}
    body = orjson.dumps({"check": PROBE_TEXT})
    out: list[tuple[str, str, Any]] = []
    if not runner.job.reverse:
        for target_queue in mapping.target_queues():
            if "queue" in actions:
                out.append(("queue", target_queue, Outgoing("queue", target_queue, dict(headers), body)))
            if "delayed" in actions:
                out.append(("delayed", target_queue, Outgoing("delayed", target_queue, dict(headers), body,
                                                              due=datetime(2000, 1, 1, tzinfo=UTC))))
        if "error" in actions:
            error = runner.job.target.error_queue
            out.append(("queue", error, Outgoing("queue", error, dict(headers), body)))
        return out
    # A reverse job's message for the legacy side, made by its target's envelope when the probe runs,
    # of a type the mapping knows (the legacy side needs its own name for it).
    known = next(iter(mapping.types.values()), "QBridge.Check, QBridge")
    msg = CanonicalMessage(message_id=uuid.uuid4(), source=SourceRef(system="nservicebus", database=runner.database,
                                                                      queue=queue, key="check"),
                           state="ready", destination=queue, time_sent=utcnow(), body=body,
                           enclosed_types=[known], headers={**headers, "NServiceBus.EnclosedMessageTypes": known})
    return [("queue", mapping.route([queue]) or queue, msg)]


def _record(runner: JobRunner, conn: sa.Connection, queue: str, source: Any, out: Any) -> None:
    """The books of a batch as `_deliver` records them, for a queue no source has."""
    origin = queue_origin("check", runner.database, f"{queue}#qbridge check")
    ranged = source.cursor == "monotonic"
    delivered = LedgerEntry(str(uuid.uuid4()), "1" if ranged else "check-1", "delivered", runner.target.ledger_target(out)
                            if hasattr(runner.target, "ledger_target") else queue)
    lost = str(uuid.uuid4())
    quarantined = Quarantined(lost, "2" if ranged else "check-2", "qbridge check", {"check": PROBE_TEXT})
    runner.state.record(conn, CHECK_JOB, queue, origin,
                        [delivered, LedgerEntry(lost, quarantined.source_key, "quarantined", None, "qbridge check")],
                        [quarantined], ranged=ranged)


def _receiver(runner: JobRunner, table_queue: str) -> NServiceBusSource | None:
    """The transport's own receive, over a forward job's target (the reverse job's source class)."""
    if runner.job.reverse:
        return None
    t = runner.job.target
    job = runner.job.model_copy(update={"source": SourceConfig(system="nservicebus", connection=t.connection,
                                                               queues=[table_queue], flavor=t.flavor, schema=t.schema_,
                                                               catalog=t.catalog)})
    return NServiceBusSource(job, runner.target_engine, table_queue, runner.database)


def _head(runner: JobRunner, conn: sa.Connection, kind: str, table_queue: str) -> Any:
    """The newest row's seq of a queue table before the probe wrote (None: empty, or a delayed table)."""
    receiver = _receiver(runner, table_queue)
    if receiver is None or kind != "queue":
        return None
    return conn.execute(sa.select(sa.func.max(receiver.seq))).scalar()


def _read_back_as_endpoint(runner: JobRunner, conn: sa.Connection, kind: str, table_queue: str, out: Any, before: Any) -> str:
    """`_read_back`, where this login may: an endpoint's login receives (SELECT, UPDATE, DELETE on
    its queue), and qbridge's needs only INSERT there."""
    try:
        with conn.begin_nested():
            return _read_back(runner, conn, kind, table_queue, out, before)
    except sa.exc.DBAPIError as e:
        if not DENIED.search(str(e.orig)):
            raise
        return ("the transport's receive could not read it back with this login (receiving is the endpoint's right, "
                "not qbridge's; `qbridge check` with the endpoint's login reads it back)")


def _read_back(runner: JobRunner, conn: sa.Connection, kind: str, table_queue: str, out: Any, before: Any) -> str:
    receiver = _receiver(runner, table_queue)
    if receiver is None:
        return "the legacy side's receive is its own application's"
    receiver.due_only = True
    # the transport's receive: the oldest row, skip-locked (a delayed one due first: the probe's is due in 2000)
    rows = receiver.fetch_after_seq(conn, None, 1) if kind == "queue" else receiver.fetch_after(conn, None, 1, True)
    ours = [r for r in rows if PROBE_TEXT in (r.values.get("headers") or "")]
    after = before
    while not ours and kind == "queue":  # behind what committed meanwhile: the receive, page after page
        page = receiver.fetch_after_seq(conn, after, 500)
        if not page:
            break
        ours = [r for r in page if PROBE_TEXT in (r.values.get("headers") or "")]
        after = int(page[-1].values["key"])
    if not ours:
        raise ReadBack(f"the transport's receive did not find the row just written to {table_queue!r}")
    row = ours[0]
    if orjson.loads(row.values["headers"]) != out.headers or row.values["body"] != out.body:
        raise ReadBack(f"{table_queue!r} gave back other bytes than were written: {row.values['headers'][:200]!r} "
                       f"(a column that is not Unicode, or a legacy collation, changes {PROBE_TEXT!r})")
    return "the transport's receive read it back byte for byte" + ("" if rows and rows[0] is row else
                                                                     " (after the queue's own older messages)")


class ReadBack(Exception):
    pass


def _queue_needs(runner: JobRunner, url: str, kind: str, table_queue: str) -> list[tuple[str, Need]]:
    if runner.job.reverse:
        return [(url, Need("INSERT", t)) for t in tables_of(runner.target) if not t.name.startswith("qbridge_")]
    tables = runner.tables
    table = tables.delayed(table_queue) if kind == "delayed" else tables.queue(table_queue)
    return [(url, Need("INSERT", table))]


def _mssql(runner: JobRunner, kind: str, table_queue: str) -> list[str]:
    """The INSERT the SQL Server flavor runs (where COPY ran here, no statement was executed);
    none for a legacy target, whose inserts were executed and recorded."""
    if runner.job.reverse:
        return []
    from sqlalchemy.dialects import mssql

    tables = runner.tables
    table = tables.delayed(table_queue) if kind == "delayed" else tables.queue(table_queue)
    return [" ".join(str(table.insert().compile(dialect=mssql.dialect())).split())]


def _lock_probes(checker: Checker, runner: JobRunner) -> None:
    job, engine, url = runner.job.name, runner.target_engine, runner.target_url
    schema = runner.state.checkpoint.schema
    jobs = fence.jobs_table(schema)

    def lock(rec: Recorder) -> str:
        path = sqlite_file(url)
        if path is not None:  # a file beside the database, flocked: taken by nothing here (a file would stay)
            if not os.access(path.parent, os.W_OK):
                raise PermissionError(f"{path.parent} is not writable: the job's lock is a file made there on its first run")
            return "the job's lock is a file beside the database (its directory is writable)"
        # Under the check's own name: the job's own lock taken now would make a starting `run` stand by a whole tick.
        probe = JobLock(engine, CHECK_JOB, "qbridge check", schema, runner.job.target.connection)
        rec.extra_mssql.append(acquire_statement("mssql", probe.name)[0])
        try:
            if not probe._take():
                raise RuntimeError("another qbridge check holds its own lock: run it again")
        finally:
            probe.release()
        return "a session lock of the kind the job takes was taken and let go"

    def fenced(rec: Recorder) -> str:
        who = "qbridge check"
        with rolled_back(engine) as conn:
            now = datetime.now(UTC).replace(tzinfo=None)
            conn.execute(fence.Fence(jobs, runner.job.name, None, who).statement())
            conn.execute(fence.epoch_row(jobs, CHECK_JOB, who, now))  # a job's first lock makes its row
            conn.execute(fence.epoch_raise(jobs, CHECK_JOB, who, now))
        return "the fence was read, and a row made and its epoch raised for the check's own job (rolled back)"

    checker.run(job, "target", "job lock", (engine,), lock)
    checker.run(job, "target", "fence", (engine,), fenced, lambda: [(url, Need("SELECT, INSERT, UPDATE", jobs))])
