"""`qbridge init` folding the per-message ledger entries of increasing keys (NGinn queues) into
the range ledger (bridge.ledger.ranges), where an earlier qbridge made the ledger without it.

The bits go into `qbridge_ledger_ranges_new`, renamed into place when every entry is folded:
until then every other command refuses the ledger (`require_current`), since a Spark unit that
trusts the bits alone would not see an entry still waiting to be folded. Each transaction locks
up to CHUNK entries of one queue, sets their bits and deletes exactly those entries, so a fold
cut off anywhere resumes where it stopped on the next `init`. A quarantined entry gets its bit
and stays (its reason; its row waits in the quarantine).

The fold refuses, changing nothing, while the ledger holds entries of a queue the config does not
name: the ledger does not say which system such a queue is, and an NGinn queue's entries left out
would be unseen by a Spark unit that trusts the bits (its messages delivered again).

A range ledger in place proves no fold either (a DBA may create it from `--print-sql`'s DDL, or
a fold may have left a queue out, or been cut off): a queue with a delivered or skipped entry
without a bit, or with entries and no range row, is `unfolded`, which every command refuses
(`JobSetup.check_ledger`) and `init` folds in place. A fold gives a queue's quarantined entries
their bits first, in one transaction, so a fold cut off anywhere leaves one of the two. A
replayed or discarded quarantined message's entry has its bit ("quarantined"), and stays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from bridge.errors import TargetSchemaError
from bridge.ledger.ranges import OUTCOMES, RANGES, Ranges, bits_of, keys_of, ranges_table
from bridge.ledger.state import State
from bridge.ledger.upgrade import rename_sql, without_ranges
from bridge.sources import source_class

RANGES_NEW = RANGES + "_new"
CHUNK = 10_000  # entries folded per transaction
DELETE_CHUNK = 1_000  # keys per DELETE statement: under SQL Server's 2,100 parameters
FOLDED = ("delivered", "skipped")


def ranged_origins(origins: Sequence[Any]) -> list[int]:
    """The origins (bridge.ledger.upgrade.QueueOrigin) whose keys the range ledger keeps."""
    return sorted({o.origin for o in origins if source_class(o.system).cursor == "monotonic"})


def add_ranges(engine: sa.Engine, schema: str | None, origins: Sequence[Any], connection: str,
               say: Callable[[str], None] = lambda _: None) -> int | None:
    """Folds the entries of the ranged queues among `origins` (bridge.ledger.upgrade.QueueOrigin)
    into a new range ledger and puts it in place, or into the one in place those of queues it
    lacks; how many it folded (None: nothing to do)."""
    state = State(schema)
    with engine.connect() as conn:
        with conn.begin():
            if not sa.inspect(conn).has_table(state.ledger.name, schema=schema):
                return None
            fresh = without_ranges(conn, schema)
            if fresh:
                _check_origins(conn, state, origins, connection)
                todo = ranged_origins(origins)
            else:
                _merge_cut_off_fresh_fold(conn, state, schema, say)
                # Here, not at each command's start: every quarantined entry read, for those an
                # earlier qbridge's cut-off fold left without bits (it gave them theirs last).
                todo = [o for o in ranged_origins(origins)
                        if unfolded(conn, state, o) or _quarantined_without_bits(conn, state, o)]
                if not todo:
                    return None
        table = ranges_table(schema, sa.MetaData(), name=RANGES_NEW) if fresh else state.ranges.table
        if fresh:
            with conn.begin():
                table.create(conn, checkfirst=True)  # kept when a fold was cut off: it resumes
    ranges, l = Ranges(table), state.ledger
    total = 0
    for origin in todo:
        # Quarantined entries stay, with a bit each: first, all in one transaction, so that a fold
        # cut off anywhere leaves the queue `unfolded` (its delivered or skipped entries without
        # bits, or no range row at all) until an init finishes it.
        with engine.begin() as conn:
            ranges.mark(conn, origin, [(int(k), "quarantined") for k in _quarantined_keys(conn, state, origin)], merge=True)
        mine = (l.c.origin == origin, l.c.outcome.in_(FOLDED))
        after = None
        while True:
            with engine.begin() as conn:
                stmt = sa.select(l.c.source_key, l.c.outcome).where(*mine).order_by(l.c.source_key).limit(CHUNK)
                if after is not None:
                    stmt = stmt.where(l.c.source_key > after)
                page = conn.execute(stmt.with_for_update()).all()
                if not page:
                    break
                # A key with a bit keeps its entry: a replayed or discarded quarantined message's.
                have = ranges.lookup(conn, origin, [int(k) for k, _ in page])
                fold = [(k, o) for k, o in page if int(k) not in have]
                ranges.mark(conn, origin, [(int(k), o) for k, o in fold], merge=True)
                keys = [k for k, _ in fold]
                for start in range(0, len(keys), DELETE_CHUNK):
                    conn.execute(sa.delete(l).where(*mine, l.c.source_key.in_(keys[start:start + DELETE_CHUNK])))
            after = page[-1][0]
            total += len(fold)
            say(f"{connection}: folded {total:,} ledger entries of increasing keys into ranges")
    if fresh:
        with engine.begin() as conn:
            conn.execute(rename_sql(engine.dialect, schema, RANGES_NEW, RANGES))
    return total


def unfolded(conn: sa.Connection, state: State, origin: int) -> bool:
    """Whether the queue `origin` names has entries the range ledger in place has not taken in:
    a delivered or skipped entry without a bit (entries with one are replayed or discarded
    quarantined messages), or entries and no range row at all (a queue whose entries are all
    quarantined, never folded). A fold gives the quarantined entries their bits first, in one
    transaction, so these two say whether one finished; the quarantined entries themselves,
    which may be many, are not read (each entry a qbridge records has its bit)."""
    l, r = state.ledger, state.ranges.table
    mine = l.c.origin == origin
    if conn.execute(sa.select(l.c.source_key).where(mine).limit(1)).first() is not None and \
            conn.execute(sa.select(r.c.block).where(r.c.origin == origin).limit(1)).first() is None:
        return True
    after = None
    while True:
        stmt = sa.select(l.c.source_key).where(mine, l.c.outcome.in_(FOLDED)).order_by(l.c.source_key)
        if after is not None:
            stmt = stmt.where(l.c.source_key > after)
        keys = conn.execute(stmt.limit(CHUNK)).scalars().all()
        if not keys:
            return False
        if len(state.ranges.lookup(conn, origin, {int(k) for k in keys})) < len(keys):
            return True
        if len(keys) < CHUNK:
            return False
        after = keys[-1]


def _quarantined_keys(conn: sa.Connection, state: State, origin: int) -> list[str]:
    """The source keys of the queue `origin` names whose entries say quarantined."""
    l = state.ledger
    return list(conn.execute(sa.select(l.c.source_key).where(l.c.origin == origin, l.c.outcome == "quarantined")).scalars())


def _quarantined_without_bits(conn: sa.Connection, state: State, origin: int) -> bool:
    """Whether a quarantined entry of the queue `origin` names has no bit (init only: it reads them all)."""
    keys = _quarantined_keys(conn, state, origin)
    return len(state.ranges.lookup(conn, origin, {int(k) for k in keys})) < len(keys)


def fresh_fold_left(conn: sa.Connection, schema: str | None) -> bool:
    """Whether a fold into a new range ledger was cut off and a range ledger made in place since
    (from `init --print-sql`'s DDL): the new one holds the bits of entries the fold deleted."""
    insp = sa.inspect(conn)
    return insp.has_table(RANGES_NEW, schema=schema) and insp.has_table(RANGES, schema=schema)


def _merge_cut_off_fresh_fold(conn: sa.Connection, state: State, schema: str | None, say: Callable[[str], None]) -> None:
    """Sets the bits a cut-off fold put in qbridge_ledger_ranges_new in the range ledger in place,
    keeping any a key has there, then drops the new one (in the caller's transaction)."""
    if not fresh_fold_left(conn, schema):
        return
    new = ranges_table(schema, sa.MetaData(), name=RANGES_NEW)
    rows = conn.execute(sa.select(new.c.origin, new.c.block, *(new.c[o] for o in OUTCOMES))).all()
    for origin, block, *bits in rows:
        state.ranges.mark(conn, origin, [(k, o) for o, b in zip(OUTCOMES, bits) for k in keys_of(block, bits_of(b))], merge=True)
    new.drop(conn)
    say(f"merged a cut-off fold's {len(rows):,} range rows ({RANGES_NEW}) into {RANGES}")


def _check_origins(conn: sa.Connection, state: State, origins: Sequence[Any], connection: str) -> None:
    """Refuses when the ledger holds entries of queues `origins` (the whole config's) do not name."""
    l = state.ledger
    known = sorted({o.origin for o in origins})
    stray = conn.execute(sa.select(l.c.job, l.c.queue, sa.func.count()).where(l.c.origin.not_in(known))
                         .group_by(l.c.job, l.c.queue).order_by(l.c.job, l.c.queue)).all()
    if stray:
        raise TargetSchemaError(
            f"{connection!r}: the ledger made by an earlier qbridge cannot be folded into ranges; nothing was folded: "
            + "; ".join(f"{n} entries of job {job!r} queue {queue!r}, which this config does not have (or reads under "
                        "another source identity)" for job, queue, n in stray)
            + ". Put those jobs and queues back in the config (their sources as they were; every config sharing this "
              "database in one) and run init again: an NGinn queue's entries left unfolded would be delivered again")
