"""Keys a move-mode Spark unit delivered and has not consumed yet (issue 35).

A batch's legacy consume follows its target commit. Until it has committed, a rollback (under a
lock another process took) must see those keys as being consumed, not as rows still to deliver
again, and a unit that dies in between must leave them for someone to consume. A pass keeps such
keys in its checkpoint row (`pending`); Spark's units take no checkpoint lock, so each batch
writes a row of its own here, in its target transaction, and deletes it once its consume has
committed. The next pass (`Leftovers._consume_inflight`, pipeline/leftovers.py) consumes what a dead unit left.

Bounded: a row per batch between its two commits, plus those of units that died since the last pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa

from bridge.model import pending_key
from bridge.timefmt import naive_utc, utcnow

INFLIGHT = "qbridge_inflight"


def inflight_table(schema: str | None, metadata: sa.MetaData | None = None) -> sa.Table:
    return sa.Table(
        INFLIGHT, metadata if metadata is not None else sa.MetaData(),
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("queue", sa.String(128), primary_key=True),
        sa.Column("batch", sa.String(32), primary_key=True),
        sa.Column("source_keys", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        schema=schema,
    )


class Inflight:
    """Operations on the table, in the caller's transaction."""

    def __init__(self, table: sa.Table) -> None:
        self.table = table

    def add(self, conn: sa.Connection, job: str, queue: str, keys: Sequence[Any]) -> str:
        """Records the keys a batch will consume, in its target transaction; returns the batch's id."""
        batch = uuid.uuid4().hex
        conn.execute(sa.insert(self.table).values(job=job, queue=queue, batch=batch, at=naive_utc(utcnow()),
                                                  source_keys=orjson.dumps(list(keys)).decode()))
        return batch

    def read(self, conn: sa.Connection, job: str, queue: str) -> list[tuple[str, list[Any]]]:
        """(batch id, keys) of every batch of the queue still in flight, or left by a unit that died."""
        f = self.table
        rows = conn.execute(sa.select(f.c.batch, f.c.source_keys).where(f.c.job == job, f.c.queue == queue).order_by(f.c.at))
        return [(b, [pending_key(k) for k in orjson.loads(k)]) for b, k in rows]

    def batches(self, conn: sa.Connection, job: str, queue: str) -> list[str]:
        """The ids of the queue's batches in flight, oldest first (their keys are read one at a time: keys_of)."""
        f = self.table
        return list(conn.execute(sa.select(f.c.batch).where(f.c.job == job, f.c.queue == queue).order_by(f.c.at)).scalars())

    def keys_of(self, conn: sa.Connection, job: str, queue: str, batch: str) -> list[Any] | None:
        """The keys of one batch, None when it is no longer in flight."""
        f = self.table
        text = conn.execute(sa.select(f.c.source_keys).where(f.c.job == job, f.c.queue == queue, f.c.batch == batch)).scalar()
        return None if text is None else [pending_key(k) for k in orjson.loads(text)]

    def drop(self, conn: sa.Connection, job: str, queue: str, batch: str) -> None:
        f = self.table
        conn.execute(sa.delete(f).where(f.c.job == job, f.c.queue == queue, f.c.batch == batch))
