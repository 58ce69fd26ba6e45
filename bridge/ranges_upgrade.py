"""`qbridge init` folding the per-message ledger entries of increasing keys (NGinn queues) into
the range ledger (bridge.ledger_ranges), where an earlier qbridge made the ledger without it.

The bits go into `qbridge_ledger_ranges_new`, renamed into place when every entry is folded:
until then every other command refuses the ledger (`require_current`), since a Spark unit that
trusts the bits alone would not see an entry still waiting to be folded. Each transaction locks
up to CHUNK entries of one queue, sets their bits and deletes exactly those entries, so a fold
cut off anywhere resumes where it stopped on the next `init`. A quarantined entry gets its bit
and stays (its reason; its row waits in the quarantine).

The fold refuses, changing nothing, while the ledger holds entries of a queue the config does not
name: the ledger does not say which system such a queue is, and once the range ledger is in place
nothing folds again, so an NGinn queue's entries left out would stay entries for ever, unseen by a
Spark unit that trusts the bits (its messages delivered again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from bridge.errors import TargetSchemaError
from bridge.ledger_ranges import RANGES, Ranges, ranges_table
from bridge.ledger_upgrade import rename_sql, without_ranges
from bridge.sources import source_class
from bridge.state import State

RANGES_NEW = RANGES + "_new"
CHUNK = 10_000  # entries folded per transaction
DELETE_CHUNK = 1_000  # keys per DELETE statement: under SQL Server's 2,100 parameters
FOLDED = ("delivered", "skipped")


def ranged_origins(origins: Sequence[Any]) -> list[int]:
    """The origins (bridge.ledger_upgrade.QueueOrigin) whose keys the range ledger keeps."""
    return sorted({o.origin for o in origins if source_class(o.system).cursor == "monotonic"})


def add_ranges(engine: sa.Engine, schema: str | None, origins: Sequence[Any], connection: str,
               say: Callable[[str], None] = lambda _: None) -> int | None:
    """Folds the entries of the ranged queues among `origins` (bridge.ledger_upgrade.QueueOrigin)
    into a new range ledger and puts it in place; how many it folded (None: nothing to do)."""
    with engine.connect() as conn:
        with conn.begin():
            if not without_ranges(conn, schema):
                return None
            _check_origins(conn, State(schema), origins, connection)
        new = ranges_table(schema, sa.MetaData(), name=RANGES_NEW)
        with conn.begin():
            new.create(conn, checkfirst=True)  # kept when a fold was cut off: it resumes
    state = State(schema)
    ranges, l = Ranges(new), state.ledger
    total = 0
    for origin in ranged_origins(origins):
        mine = (l.c.origin == origin, l.c.outcome.in_(FOLDED))
        while True:
            with engine.begin() as conn:
                page = conn.execute(sa.select(l.c.source_key, l.c.outcome).where(*mine).limit(CHUNK)
                                    .with_for_update()).all()
                if not page:
                    break
                ranges.mark(conn, origin, [(int(k), o) for k, o in page], merge=True)
                keys = [k for k, _ in page]
                for start in range(0, len(keys), DELETE_CHUNK):
                    conn.execute(sa.delete(l).where(*mine, l.c.source_key.in_(keys[start:start + DELETE_CHUNK])))
            total += len(page)
            say(f"{connection}: folded {total:,} ledger entries of increasing keys into ranges")
        with engine.begin() as conn:  # quarantined entries stay, with a bit each
            quarantined = conn.execute(sa.select(l.c.source_key).where(l.c.origin == origin, l.c.outcome == "quarantined")).scalars()
            ranges.mark(conn, origin, [(int(k), "quarantined") for k in quarantined], merge=True)
    with engine.begin() as conn:
        conn.execute(rename_sql(engine.dialect, schema, RANGES_NEW, RANGES))
    return total


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
