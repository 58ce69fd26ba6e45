"""`qbridge rollback`: a forward job's delivered messages that no endpoint has taken yet, withdrawn
from the NServiceBus tables and forgotten by the ledger, so that a later `migrate` or `sync`
delivers them again exactly once (issue 28).

A delivered row is found by its `QBridge.Source` header (`system://database/queue/key`, written
on every message) in the tables the job writes (queues, `.Delayed`, error, audit), and is taken
only when its `NServiceBus.MessageId` is the message's deterministic id, the ledger says it was
delivered, and no endpoint has processed it (an endpoint's audit or error copy carries
`$.diagnostics.hostid` or `NServiceBus.ProcessingStarted`). What the ledger has as delivered and no table holds any more
was consumed: counted and listed, never withdrawn.

Per batch, one target transaction locks the listed target rows (an endpoint's receive skips a
locked row; a row it took meanwhile is not there to lock, and counts as consumed), deletes them,
clears their ledger bits or entries, takes them off the totals, and for NGinn lowers the
checkpoint below them so a pass reads them again. Killed at any point, a batch is either
withdrawn whole or not at all, and rollback run again withdraws what is left.

Move mode consumed the legacy rows: the same transaction records what each needs to be given
back, and bridge.ledger.giveback gives them back in a second, legacy, commit (see there for why a kill
between the two loses and doubles nothing). NGinn's consumed row stays in its table and gets its
subqueue back; OpenJMS and BizTalk delete theirs, which are rebuilt from the delivered row and
re-inserted, with a mark in the legacy database (bridge.ledger.giveback_marks).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

from bridge import faults, tracing
from bridge.config import Config
from bridge.db import read_only_engine
from bridge.errors import TargetSchemaError, UsageError
from bridge.ledger import giveback, giveback_marks
from bridge.ledger.state import pending_key
from bridge.ledger.totals import WITHDRAWN
from bridge.model import queue_origin
from bridge.pipeline.loop import JobRunner, database_identity
from bridge.sources import SourceRow
from bridge.sources.nginn import STATEMENT_KEYS
from bridge.sources.nservicebus import bare_queue, transport_utc
from bridge.targets.base import Skipped
from bridge.timefmt import from_wire

BATCH = 1000  # rows withdrawn per transaction
LISTED = 50  # consumed message ids listed (all are counted)
# Set by an endpoint that processed the message, on its audit and error copies (reference
# nservicebus-target.md: audit and fault metadata); qbridge's own error rows carry neither.
PROCESSED = ("$.diagnostics.hostid", "NServiceBus.ProcessingStarted")


@dataclass
class Withdrawal:
    job: str
    queue: str
    withdrawn: int = 0  # taken out of the target tables, forgotten by the ledger
    by_table: Counter[str] = field(default_factory=Counter)
    consumed: int = 0  # delivered, no longer in any target table: cannot be withdrawn
    consumed_ids: list[str] = field(default_factory=list)  # the first LISTED of them
    kept: int = 0  # in the target, but its legacy row was consumed since: it stays delivered
    given_back: int = 0  # move mode: legacy rows given back to the legacy receiver
    quarantined: int = 0  # move mode: legacy rows gone before they could be given back (bridge.ledger.giveback)
    unsure: int = 0  # move mode: kept, as no one subqueue it came from maps to where its message is
    unsure_why: Counter[str] = field(default_factory=Counter)  # reason -> how many (reasons name mapping rules: few)

    def consumed_one(self, message_id: str) -> None:
        self.consumed += 1
        if len(self.consumed_ids) < LISTED:
            self.consumed_ids.append(message_id)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "queue": self.queue, "withdrawn": self.withdrawn, "by_table": dict(self.by_table),
                "consumed": self.consumed, "consumed_ids": self.consumed_ids, "kept": self.kept,
                "given_back": self.given_back, "quarantined": self.quarantined, "unsure": self.unsure,
                "unsure_reasons": dict(self.unsure_why)}


def check(runner: JobRunner) -> None:
    job = runner.job
    if job.reverse:
        raise UsageError(f"job {job.name!r} is a reverse job: its messages went into a legacy store, whose receivers "
                         "take them as they come; rollback withdraws what a forward job wrote into NServiceBus tables")
    if job.mode == "move" and not all(s.gives_back for s in runner.sources.values()):
        raise UsageError(f"job {job.name!r} is in move mode on {job.source.system}, whose consumed legacy rows "
                         "qbridge cannot give back; nothing done")


def rollback(runner: JobRunner, queue: str | None = None, dry_run: bool = False,
             config: Config | None = None, progress: Callable[[str, int, int], None] = lambda q, done, of: None) -> list[Withdrawal]:
    """`config`: the config the job comes from, whose other jobs' queues are told apart by their
    source identity (without it, any other job with a checkpoint of a same-named NGinn queue in
    this ledger refuses the rollback). `progress(queue, rows done, rows found)` after each batch.
    Traced as `qbridge.rollback`."""
    with tracing.span("qbridge.rollback", job=runner.job.name, queue=queue, dry_run=dry_run) as s:
        done = _rollback(runner, queue, dry_run, config, progress)
        s.set_attribute("qbridge.queues", len(done))
        return done


def _rollback(runner: JobRunner, queue: str | None, dry_run: bool, config: Config | None,
              progress: Callable[[str, int, int], None]) -> list[Withdrawal]:
    check(runner)
    runner.check_ledger()
    if queue is not None and queue not in runner.sources:
        raise UsageError(f"job {runner.job.name!r} has no queue {queue!r} (it has {', '.join(runner.sources)})")
    for name in [queue] if queue else list(runner.sources):
        others = _sharing(runner, name, config)
        if others:
            raise UsageError(
                f"job {runner.job.name!r} queue {name!r}: job(s) {', '.join(map(repr, others))} read the same NGinn "
                "queue into this ledger, whose ranges keep no job: rollback would withdraw their messages too (a "
                "move-mode job consumed their legacy rows, so they would come back as skipped) and move only this "
                "job's checkpoint back; nothing done")
    move = runner.job.mode == "move"
    if move and not runner.givebacks_kept():
        raise TargetSchemaError(f"the target {runner.job.target.connection!r} has no qbridge_givebacks table, which a "
                                "move-mode rollback writes (made by an earlier qbridge): run `qbridge init -c CONFIG`")
    src = runner.job.source
    if (move and any(s.marks_give_backs for s in runner.sources.values())
            and not giveback_marks.kept(runner.source_engine, src.schema_)):
        raise TargetSchemaError(f"the legacy database {src.connection!r} has no {giveback_marks.MARKS} table, which a "
                                f"move-mode rollback of {src.system} writes with every give-back: run `qbridge init -c "
                                "CONFIG` (or `--print-sql` for a DBA); nothing done")
    out = []
    for name in [queue] if queue else list(runner.sources):
        w = Withdrawal(runner.job.name, name)
        out.append(w)
        if dry_run:  # writes nothing, not even a checkpoint row: it may run with a login that can only read
            runner.check_ledger()
        else:
            runner._prepare(name, give_back=False)  # a rollback counts what it gives back itself
        if not dry_run:
            # Rows a pass delivered and did not consume yet, and rows an earlier rollback still
            # owes, settled first: every delivered row is then consumed, and every owed one back.
            if move:
                runner._consume_pending(name)
            _count_given(w, giveback.finish(runner, name))
            if move:
                giveback.forget_marks(runner, name)
        with runner.target_engine.connect() as tconn:
            delivered = {key: mid for key, mid, _ in runner.delivered(tconn, name)}
        found = _in_target(runner, name, delivered)
        for key, mid in delivered.items():
            if key not in found:
                w.consumed_one(mid)
        rows = [(key, *found[key]) for key in sorted(found, key=_order)]
        reader = read_only_engine(runner.source_url)  # read under the checkpoint lock: no SQLite write lock
        try:
            for start in range(0, len(rows), BATCH):
                progress(name, start, len(rows))
                if dry_run:
                    with runner.target_engine.connect() as tconn:
                        batch = _redeliverable(runner, reader, name, rows[start:start + BATCH], w, tconn)
                    w.withdrawn += len(batch)
                    w.by_table.update(table for _, table, _, _, _ in batch)
                    w.given_back += sum(1 for *_, owed in batch if owed is not None)
                    continue
                _withdraw(runner, reader, name, rows[start:start + BATCH], w)
                if move:
                    _count_given(w, giveback.finish(runner, name))
            progress(name, len(rows), len(rows))
        finally:
            reader.dispose()
    return out


def _count_given(w: Withdrawal, counts: tuple[int, int]) -> None:
    w.given_back += counts[0]
    w.quarantined += counts[1]


UNSURE = ("what its legacy row was cannot be told from the delivered row (which subqueue it came from, or what kind "
          "of body it had), so it cannot be given back as it was")
PENDING = ("I", "R", "F")  # NGinn rows a pass delivers again as they were; a processed one ('X') is skipped


Item = tuple[str, str, Any, str, giveback.Owed | None]  # key, table, row id, message id, what its legacy row is owed


def _redeliverable(runner: JobRunner, reader: sa.Engine, queue: str, batch: list[tuple[str, str, Any, str]],
                   w: Withdrawal, tconn: sa.Connection) -> list[Item]:
    """The batch's messages whose legacy row is still there to be delivered again, with what
    it is owed in move mode (the job consumed it: it is given back). In copy mode the legacy
    system's own receiver, or the job when it ran in move mode before, may have consumed it:
    such messages stay delivered, counted as kept, as do those whose row is gone."""
    with reader.connect() as sconn:
        return _redeliverable_read(runner, sconn, queue, batch, w, tconn)


def _redeliverable_read(runner: JobRunner, sconn: sa.Connection, queue: str, batch: list[tuple[str, str, Any, str]],
                        w: Withdrawal, tconn: sa.Connection) -> list[Item]:
    source = runner.sources[queue]
    if source.cursor == "monotonic":
        rows = {str(r.key): r for r in source.fetch_ranges(sconn, [(int(k), int(k)) for k, *_ in batch], False)}
    else:
        rows = {str(r.key): r for r in source.fetch_keys(sconn, [k for k, *_ in batch], False)}
    audit = runner.job.target.audit_queue
    move = runner.job.mode == "move"
    translated: frozenset[str] = getattr(source, "translated_headers", frozenset())
    rebuilt = move and source.marks_give_backs  # consumed rows are gone: rebuilt from what was delivered
    content = delivered_rows(runner, tconn, [(t, r) for k, t, r, _ in batch if k not in rows]) if rebuilt else {}

    def lands_in(candidate: SourceRow) -> str | None:
        """The table this job's mapping sends `candidate` to (None: skipped or quarantined)."""
        _, result, _ = runner.map_row(source, candidate, translated)
        return None if result is None or isinstance(result, Skipped) else runner.target.ledger_target(result).lower()

    out: list[Item] = []
    for key, table, row_id, mid in batch:
        row = rows.get(key)
        if row is not None and (source.cursor != "monotonic" or row.values.get("subqueue") in PENDING):
            out.append((key, table, row_id, mid, None))
            continue
        if row is not None and not move and table == audit:
            out.append((key, table, row_id, mid, None))  # a processed row, sent to audit by the mapping
            continue
        if row is not None and move:
            # Processed by the legacy receiver (delivered as such), or consumed by move mode from
            # the subqueue whose mapping sends it where the message is: the source tells.
            verdict, payload = source.give_back_payload(row, table.lower(), lands_in)
        elif row is None and rebuilt and (table, row_id) in content:
            verdict, payload = source.give_back_delivered(sconn, key, table.lower(), content[table, row_id])
        else:
            w.kept += 1  # its legacy row was consumed: withdrawn, it could not come back
            continue
        if verdict == "theirs":
            out.append((key, table, row_id, mid, None))
        elif verdict == "owed":
            assert payload is not None  # every source's "owed" comes with its payload
            out.append((key, table, row_id, mid, giveback.Owed(key, mid, payload)))
        else:
            # Which subqueue it came from cannot be told, or the delivered row lacks what
            # rebuilding the legacy one needs: it stays delivered.
            w.kept += 1
            w.unsure += 1
            w.unsure_why[(payload or {}).get("why", UNSURE)] += 1
    return out


def delivered_rows(runner: JobRunner, tconn: sa.Connection, where: list[tuple[str, Any]]) -> dict[tuple[str, Any], dict[str, Any]]:
    """(table, row id) -> the target row as `Source.give_back_delivered` takes it."""
    tables = {str(t.name): t for t in runner.target.tables()}
    by_table: dict[str, list[Any]] = {}
    for name, row_id in where:
        by_table.setdefault(name, []).append(row_id)
    replies = {runner.tables.address(routed): legacy for legacy, routed in runner.mapping.routes.items()}
    out: dict[tuple[str, Any], dict[str, Any]] = {}
    for name, ids in by_table.items():
        table = tables[name]
        col = runner.tables.column
        cols = [row_key(table), col(table, "Headers"), col(table, "Body")]
        expires = [c for c in table.c if c.name.lower() == "expires"]
        for start in range(0, len(ids), STATEMENT_KEYS):
            stmt = sa.select(*cols, *expires).where(cols[0].in_(ids[start:start + STATEMENT_KEYS]))
            for r in tconn.execute(stmt):
                headers = orjson.loads(r[1])
                reply = headers.get("NServiceBus.ReplyToAddress")
                out[name, r[0]] = {"headers": headers, "body": bytes(r[2] or b""), "sent": _sent(headers),
                                   "expires": transport_utc(r[3]) if expires else None,
                                   "reply_to": replies.get(reply, bare_queue(reply)) if reply else None}
    return out


def _sent(headers: dict[str, str]) -> Any:
    try:
        return from_wire(headers["NServiceBus.TimeSent"])
    except (KeyError, ValueError):
        return None


def _sharing(runner: JobRunner, queue: str, config: Config | None) -> list[str]:
    """Other jobs whose checkpoint says they may read the NGinn keys of `queue` into this ledger
    (the range ledger's bits name no job: their deliveries and this job's look alike)."""
    if runner.sources[queue].cursor != "monotonic":
        return []  # per-message entries name their job: only this job's are withdrawn
    c = runner.state.checkpoint
    with runner.target_engine.connect() as tconn:
        jobs = tconn.execute(sa.select(c.c.job).where(c.c.queue == queue, c.c.job != runner.job.name)).scalars().all()
    out = []
    for name in sorted(jobs):
        other = next((j for j in config.jobs if j.name == name), None) if config is not None else None
        if other is not None and config is not None and (
                other.reverse or other.source.system != runner.job.source.system
                or queue_origin(other.source.system, database_identity(other, config.connections[other.source.connection]),
                                queue) != runner.origins[queue]):
            continue  # another legacy database's queue of the same name, or not an NGinn queue
        out.append(name)
    return out


def _order(key: str) -> Any:
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def _in_target(runner: JobRunner, queue: str, delivered: dict[str, str]) -> dict[str, tuple[str, Any, str]]:
    """key -> (table, row id, message id) of the rows in the job's tables that carry a message of
    `queue` the ledger has as `delivered` (key -> message id) and no endpoint has processed."""
    source = runner.sources[queue]
    prefix = f"{source.system}://{runner.database}/{queue}/"
    escaped = orjson.dumps(prefix).decode()[1:-1].replace("/", "\\/")  # as the transport's JSON writes it
    found: dict[str, tuple[str, Any, str]] = {}
    tables = [t for t in runner.target.tables() if t.name != "SubscriptionRouting"]
    with runner.target_engine.connect() as tconn:
        for table in tables:
            headers_col, key_col = runner.tables.column(table, "Headers"), row_key(table)
            stmt = sa.select(key_col, headers_col).execution_options(stream_results=True, yield_per=2000)
            for row_id, text in tconn.execute(stmt):
                if prefix not in text and escaped not in text:  # rows of other jobs and senders: not parsed
                    continue
                h = orjson.loads(text)
                origin = h.get("QBridge.Source", "")
                if not origin.startswith(prefix) or any(p in h for p in PROCESSED):
                    continue
                key = origin[len(prefix):]
                mid = delivered.get(key)
                if mid is not None and h.get("NServiceBus.MessageId") == mid:
                    found[key] = (str(table.name), row_id, mid)
    return found


def row_key(table: sa.Table) -> sa.Column:
    """A column that names one row: the transport's sequence where it has one, else its id."""
    for name in ("seq", "RowVersion", "id"):
        if name in table.c:
            return table.c[name]
    raise AssertionError(f"no row key in {table.name}")


def _withdraw(runner: JobRunner, reader: sa.Engine, queue: str, listed: list[tuple[str, str, Any, str]],
              w: Withdrawal) -> None:
    source, origin, state = runner.sources[queue], runner.origins[queue], runner.state
    ranged = source.cursor == "monotonic"
    inflight = runner.inflight_kept()  # before the transaction: it connects (SQLite would wait on tconn)
    with runner.target_engine.begin() as tconn:
        cp = state.lock_checkpoint(tconn, runner.job.name, queue)  # one writer of the queue's books at a time
        # Under the lock, the legacy rows are as the last pass left them: a key still pending is
        # being consumed by a pass (its legacy commit comes after its target commit), so it stays
        # delivered; any other row is read now, after its consume (if any) committed.
        # So is a key a Spark unit delivered and has not consumed yet (its task may be alive yet,
        # under a migrate whose lock was lost: its consume is still to come).
        pending = {pending_key(k) for k in cp.pending}
        if inflight:
            pending.update(k for _, keys in state.inflight.read(tconn, runner.job.name, queue) for k in keys)
        settled = [r for r in listed if pending_key(int(r[0]) if ranged else r[0]) not in pending]
        w.kept += len(listed) - len(settled)
        batch = _redeliverable(runner, reader, queue, settled, w, tconn)
        keys = _lock_and_delete(runner, tconn, batch, w)
        l = state.ledger
        for start in range(0, len(keys), STATEMENT_KEYS):
            tconn.execute(sa.delete(l).where(l.c.origin == origin, l.c.source_key.in_(keys[start:start + STATEMENT_KEYS])))
        if ranged and keys:
            state.ranges.unmark(tconn, origin, [int(k) for k in keys])
            low = min(int(k) for k in keys) - 1
            if cp.high is not None and low < cp.high:
                cp.high = low if low > 0 else None
                cp.gaps = [g for g in cp.gaps if g.hi <= low]
                state.save_checkpoint(tconn, cp)
        if keys:
            state.totals.add(tconn, runner.job.name, queue, origin,
                             Counter({("delivered", None): -len(keys), (WITHDRAWN, None): len(keys)}))
        withdrawn = set(keys)
        giveback.owe(tconn, state, runner.job.name, queue, [o for *_, o in batch if o is not None and o.key in withdrawn])
        runner.fenced(tconn)
        faults.reached("rollback_before_commit")
    faults.reached("rollback_after_commit")
    w.withdrawn += len(keys)


def _lock_and_delete(runner: JobRunner, tconn: sa.Connection, batch: list[Item], w: Withdrawal) -> list[str]:
    """Locks the batch's target rows, deletes those still there and returns their keys. A row an
    endpoint took since it was listed (its receive holds it, or deleted it) is not there to lock:
    its message was consumed, so the ledger keeps it and it is counted as such."""
    tables = {str(t.name): t for t in runner.target.tables()}
    by_table: dict[str, dict[Any, tuple[str, str]]] = {}  # table -> row id -> (key, message id)
    for key, table_name, row_id, mid, _ in batch:
        by_table.setdefault(table_name, {})[row_id] = (key, mid)
    keys = []
    for name, rows in by_table.items():
        table = tables[name]
        col, ids = row_key(table), list(rows)
        for start in range(0, len(ids), STATEMENT_KEYS):
            chunk = ids[start:start + STATEMENT_KEYS]
            present = list(tconn.execute(sa.select(col).where(col.in_(chunk)).with_for_update()
                                         .with_hint(table, "WITH (UPDLOCK, ROWLOCK)", "mssql")).scalars())
            if present:
                tconn.execute(sa.delete(table).where(col.in_(present)))
            w.by_table[name] += len(present)
            keys += [rows[i][0] for i in present]
            for gone in set(chunk) - set(present):
                w.consumed_one(rows[gone][1])
    return keys
