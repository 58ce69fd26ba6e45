"""Which of a batch's source keys the ledger already holds, and with what outcome: the lookup
every batch makes before it delivers (a key found is `already`, never delivered again)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from bridge.db import TEXT_SEPARATOR as KEY_SEPARATOR
from bridge.db import among

__all__ = ["KEY_SEPARATOR", "entries"]


def entries(conn: sa.Connection, ledger: sa.Table, origin: int, keys: Sequence[str]) -> dict[str, str]:
    """source key -> outcome, for those of `keys` in the ledger under `origin`."""
    l = ledger
    mine = l.c.origin == origin
    if conn.dialect.name == "postgresql":
        # By the ledger's key. A batch's keys are neighbours in it (scan sources walk in the
        # ledger's order), but PostgreSQL costs each of a batch's 1,000-2,000 probes as a random
        # disk read and, below some millions of entries, reads every entry of the queue instead,
        # every batch: 22 µs a key at 200k entries, 3.7 by the key (bench/scan_plans.py, issue
        # 49). For this statement only; a failed one takes the setting away with its transaction.
        # The value in force before is put back (a session's or a caller's own), not the default.
        was = conn.exec_driver_sql("SELECT current_setting('random_page_cost'), "
                                   "set_config('random_page_cost', '1.1', true)").scalar_one()
        # The keys as one text the server splits (bridge.db.among): psycopg dumps a text[] element
        # by element in Python, ~12 µs a key (12 ms a 1000-key batch, issue 49); one text, under 1.
        stmt = sa.select(l.c.source_key, l.c.outcome).where(mine, among(l.c.source_key, keys, "postgresql"))
        found = dict(conn.execute(stmt).all())
        conn.execute(sa.text("SELECT set_config('random_page_cost', :was, true)"), {"was": was})
        return found
    out: dict[str, str] = {}
    for start in range(0, len(keys), 1000):
        chunk = list(keys[start:start + 1000])
        out.update(conn.execute(sa.select(l.c.source_key, l.c.outcome).where(mine, l.c.source_key.in_(chunk))).all())
    return out

