"""Fencing tokens: a process that lost its job's lock commits nothing that assumed it held it (issue 35).

A session lock (bridge.ledger.joblock) is lost when its session ends: a failover, an idle-session
timeout, a network cut; on SQLite, a lock file removed by a cleaner. Its holder learns it only
when it next looks, and a batch already under way does not look. So every process that takes a
job's lock also raises the job's epoch in `qbridge_jobs`, in the target database, and every
transaction that writes the job's books checks, as its last statement before COMMIT, that the
epoch is still its own, reading the row shared (FOR SHARE; LOCK IN SHARE MODE; HOLDLOCK on SQL
Server; SQLite writes one transaction at a time). The next taker's raise needs that row
exclusively, so it waits for every such transaction to end; once it has committed, every later
check of the old holder fails with LockLost and its transaction rolls back.

What spans two databases is left safe by what the target transaction records, not by the fence:
a batch's legacy consume follows its fenced target commit, and the keys it consumes are pending
(a pass's in the checkpoint, a Spark unit's in qbridge_inflight) until that consume commits, so
a rollback under the new epoch keeps them delivered; a give-back follows its fenced withdrawal,
and what it owes stays in qbridge_givebacks until the legacy side has it.

Bounded: one row per job, updated in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.errors import LockLost, TargetSchemaError
from bridge.timefmt import naive_utc, utcnow

JOBS = "qbridge_jobs"


def jobs_table(schema: str | None, metadata: sa.MetaData | None = None) -> sa.Table:
    return sa.Table(
        JOBS, metadata if metadata is not None else sa.MetaData(),
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),  # raised by every process that takes the job's lock
        sa.Column("holder", sa.String(200), nullable=False),  # who raised it last
        sa.Column("taken_at", sa.DateTime(), nullable=False),
        schema=schema,
    )


@dataclass(frozen=True)
class Fence:
    """The epoch this process took for `job`."""

    table: sa.Table
    job: str
    epoch: int | None  # None: the target has no qbridge_jobs table (see `missing`)
    holder: str
    missing: str | None = None  # the error every check raises when the table is not there

    def statement(self) -> sa.Select:
        return _statement(self.table, self.job)

    def check(self, conn: sa.Connection) -> None:
        """Raises LockLost unless the job's epoch is still this one; called last in a transaction,
        its shared row lock keeps the epoch from moving until the transaction ends."""
        if self.missing is not None:
            raise TargetSchemaError(self.missing)
        row = conn.execute(self.statement()).first()
        if row is None or row[0] != self.epoch:
            taker = "nobody (its row is gone)" if row is None else f"{row[1]} at {row[2]:%Y-%m-%d %H:%M:%S} UTC"
            raise LockLost(
                f"job {self.job!r}: this process ({self.holder}) lost the job's lock (the session that held it ended: a "
                f"failover, an idle-session timeout, a network cut, or a removed lock file) and {taker} took the job; "
                "what it had not committed was rolled back, and nothing is lost: what it committed is in the ledger. "
                "Run the command again once the other process is done")


def epoch_raise(t: sa.Table, job: str, who: str, now: datetime) -> sa.Update:
    """The statement that raises a job's epoch (`qbridge check` runs it for a job no row has)."""
    return sa.update(t).where(t.c.job == job).values(epoch=t.c.epoch + 1, holder=who[:200], taken_at=now)


def epoch_row(t: sa.Table, job: str, who: str, now: datetime) -> sa.Insert:
    """The statement that makes a job's first epoch (`qbridge check` runs it for a job of its own)."""
    return sa.insert(t).values(job=job, epoch=1, holder=who[:200], taken_at=now)


def take(engine: sa.Engine, schema: str | None, job: str, who: str, connection: str = "the target") -> Fence:
    """Raises the job's epoch (the caller has just taken the job's session lock) and returns it.
    Waits for every transaction of an earlier holder that passed its check to end."""
    t = jobs_table(schema)
    now = naive_utc(utcnow())
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(JOBS, schema=schema):
            # Said by the first transaction that would write, so that what the checks before it
            # find (a legacy table missing, `init` never run) is said first.
            return Fence(t, job, None, who, missing=(
                f"the target {connection!r} has no {JOBS} table, where every process that takes a job records its "
                "fencing epoch (made by `qbridge init` since issue 35): run `qbridge init -c CONFIG` (or `--print-sql` "
                "for a DBA)"))
    for _ in range(2):
        try:
            with engine.begin() as conn:
                if conn.execute(epoch_raise(t, job, who, now)).rowcount == 0:
                    conn.execute(epoch_row(t, job, who, now))
                epoch = conn.execute(sa.select(t.c.epoch).where(t.c.job == job)).scalar_one()
            return Fence(t, job, int(epoch), who)
        except sa_exc.IntegrityError:
            continue  # another taker inserted the row first (the lock was lost in between): raise it
    raise LockLost(f"job {job!r}: another process took the job while this one was taking it")


@lru_cache(maxsize=64)
def _statement(t: sa.Table, job: str) -> sa.Select:
    """Built once a job, not once a check (bridge.ledger.state says why)."""
    return (sa.select(t.c.epoch, t.c.holder, t.c.taken_at).where(t.c.job == job)
            .with_for_update(read=True).with_hint(t, "WITH (HOLDLOCK, ROWLOCK)", "mssql"))
