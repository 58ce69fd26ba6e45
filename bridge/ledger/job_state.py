"""What a job is doing, as every reader sees it (issue 46): running, paused, held, failing or
stopped. Paused and held are in qbridge_steering; failing and stopped are known only to the
`qbridge run` that runs the job, which writes them here when they change (one row per job,
updated in place), so that `status --json` from any host, `/status.json`, `/metrics` and the
alerts all see a job that stopped on an error, not only the page of the process that stopped it.

The table is made by `init`, and by a `qbridge run` that finds it missing (it writes the rest of
the books already): a run on books older than this table still tells its state."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.timefmt import naive_utc, utcnow

log = logging.getLogger("qbridge.scheduler")
JOB_STATE = "qbridge_job_state"
STATES = ("running", "paused", "held", "failing", "stopped")


def job_state_table(schema: str | None, metadata: sa.MetaData | None = None) -> sa.Table:
    return sa.Table(
        JOB_STATE, metadata if metadata is not None else sa.MetaData(),
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("state", sa.String(12), nullable=False),  # running | failing | stopped (the run's own)
        sa.Column("reason", sa.Text()),  # the error's first line, for failing and stopped
        sa.Column("since", sa.DateTime(), nullable=False),  # UTC
        sa.Column("by", sa.String(200), nullable=False),  # the process that wrote it
        schema=schema,
    )


@dataclass(frozen=True)
class RunState:
    """What the process running a job last said of it."""

    state: str = "running"
    reason: str | None = None
    since: datetime | None = None
    by: str | None = None


def read(conn: sa.Connection, table: sa.Table, jobs: list[str]) -> dict[str, RunState]:
    """Each job's row; a job without one is running as far as anyone said. The caller knows the
    table is there (JobSetup.kept)."""
    out = {j: RunState() for j in jobs}
    if not jobs:
        return out
    for r in conn.execute(sa.select(table).where(table.c.job.in_(jobs))).mappings():
        out[r["job"]] = RunState(r["state"], r["reason"], r["since"], r["by"])
    return out


def write(engine: sa.Engine, table: sa.Table, job: str, state: str, reason: str | None, by: str) -> None:
    """Upserts the job's row (the table made first where missing: a run on older books)."""
    table.create(engine, checkfirst=True)
    values: dict[str, Any] = {"state": state, "reason": reason and reason[:2000], "since": naive_utc(utcnow()), "by": by}
    with engine.begin() as conn:
        if conn.execute(sa.update(table).where(table.c.job == job).values(**values)).rowcount:
            return
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(table).values(job=job, **values))
    except sa_exc.IntegrityError:  # another process made it meanwhile: ours is the newer word
        with engine.begin() as conn:
            conn.execute(sa.update(table).where(table.c.job == job).values(**values))


def overall(run: RunState, steering: dict[str, Any] | None) -> tuple[str, str | None]:
    """(state, why) of a job: stopped and failing first (nothing moves, whatever else holds),
    then paused, then held, else running."""
    if run.state in ("stopped", "failing"):
        return run.state, run.reason
    if steering and steering.get("paused"):
        return "paused", steering.get("why")
    if steering and steering.get("held"):
        return "held", steering.get("held")
    return "running", None


class Teller:
    """Writes one job's state when it changes, so that `status --json`, `/metrics` and the alerts
    see a job that fails or stopped. Best effort: a database that is down is what `failing`
    says, and the next change tries again."""

    def __init__(self, engine: sa.Engine, table: sa.Table, job: str, by: str) -> None:
        self.engine, self.table, self.job, self.by = engine, table, job, by
        self.told: tuple[str, str | None] | None = None

    def __call__(self, state: str, reason: str | None) -> None:
        if self.told == (state, reason):
            return
        try:
            write(self.engine, self.table, self.job, state, reason, self.by)
            self.told = (state, reason)
        except Exception as e:  # noqa: BLE001 - the state is told when the database answers again
            log.debug("job=%s its state (%s) is not in the books yet: %s", self.job, state, e)
