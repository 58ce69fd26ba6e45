"""Which of a batch's source keys the ledger already holds, and with what outcome: the lookup
every batch makes before it delivers (a key found is `already`, never delivered again)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import sqlalchemy as sa

from bridge.db import by_index
from bridge.schemas.text_in import TEXT_SEPARATOR as KEY_SEPARATOR
from bridge.schemas.text_in import among, among_text, joined

__all__ = ["KEY_SEPARATOR", "entries"]


def entries(conn: sa.Connection, ledger: sa.Table, origin: int, keys: Sequence[str]) -> dict[str, str]:
    """source key -> outcome, for those of `keys` in the ledger under `origin`."""
    l = ledger
    mine = l.c.origin == origin
    if conn.dialect.name == "postgresql":
        # By the ledger's key (bridge.db.by_index): a batch's keys are neighbours in it (scan
        # sources walk in the ledger's order), and the planner read every entry of the queue.
        # The keys as one text the server splits (bridge.schemas.text_in.among): psycopg dumps a text[] element
        # by element in Python, ~12 µs a key (12 ms a 1000-key batch, issue 49); one text, under 1.
        # Where a key holds the separator: an IN list, still by the key.
        text = joined(keys)
        stmt, values = ((_by_text(l), {"origin_": origin, "keys_": text}) if text is not None else
                        (sa.select(l.c.source_key, l.c.outcome).where(mine, among(l.c.source_key, keys, "postgresql")), {}))
        with by_index(conn):
            return dict(conn.execute(stmt, values).all())
    out: dict[str, str] = {}
    for start in range(0, len(keys), 1000):
        chunk = list(keys[start:start + 1000])
        out.update(conn.execute(sa.select(l.c.source_key, l.c.outcome).where(mine, l.c.source_key.in_(chunk))).all())
    return out


@lru_cache(maxsize=64)
def _by_text(l: sa.Table) -> sa.Select:
    """The lookup built once a ledger table, not once a batch (bridge.ledger.state says why)."""
    return sa.select(l.c.source_key, l.c.outcome).where(l.c.origin == sa.bindparam("origin_"), among_text(l.c.source_key, "keys_"))
