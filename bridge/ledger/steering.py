"""Steering a job at runtime (issue 38): paused by an operator, or held by back-pressure.

The state lives in the target database beside the checkpoints, so that every process running
the job (the active `qbridge run`, its standbys, a `sync --once` or a `migrate`) reads the same
answer before each pass: a pause set while a batch is in flight lets that batch commit, and the
next one does not start. One row per job, updated in place; the actions on it (pause, resume,
and what the status page does) are audited in `qbridge_steering_audit`, which keeps the newest
AUDIT_KEEP rows per job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.errors import TargetSchemaError, UsageError
from bridge.timefmt import naive_utc, utcnow

STEERING = "qbridge_steering"
STEERING_AUDIT = "qbridge_steering_audit"
AUDIT_KEEP = 1000  # audit rows kept per job: operators' actions, newest first


def steering_table(schema: str | None, metadata: sa.MetaData | None = None) -> sa.Table:
    return sa.Table(
        STEERING, metadata if metadata is not None else sa.MetaData(),
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("paused_by", sa.String(128)),
        sa.Column("paused_at", sa.DateTime()),
        sa.Column("why", sa.Text()),
        # Back-pressure, written by the process running the job: what holds it, since when, and
        # the seconds it was held in all (a counter that only grows).
        sa.Column("held", sa.String(500)),
        sa.Column("held_since", sa.DateTime()),
        sa.Column("held_seconds", sa.Float(), nullable=False, server_default="0"),
        schema=schema,
    )


def steering_audit_table(schema: str | None, metadata: sa.MetaData | None = None) -> sa.Table:
    return sa.Table(
        STEERING_AUDIT, metadata if metadata is not None else sa.MetaData(),
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),  # paused | resumed | replayed group | discarded group ...
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("why", sa.Text()),
        sa.Column("detail", sa.Text()),
        sa.Index("ix_qbridge_steering_audit_job", "job", "id"),
        schema=schema,
    )


@dataclass(frozen=True)
class Steering:
    """What the target says of one job."""

    job: str
    paused: bool = False
    paused_by: str | None = None
    paused_at: datetime | None = None
    why: str | None = None
    held: str | None = None
    held_since: datetime | None = None
    held_seconds: float = 0.0

    def paused_line(self) -> str:
        when = f"{self.paused_at:%Y-%m-%d %H:%M:%S} UTC" if self.paused_at else "an unknown time"
        return f"job {self.job!r} is paused by {self.paused_by or 'someone'} since {when}: {self.why or '(no reason given)'}"

    def replay_refused(self) -> str:
        """Why a replay of the paused job's messages is refused (`quarantine replay`, the page's button)."""
        return (f"{self.paused_line()}; its messages are not replayed while it is paused (resume it, or replay with "
                "--even-if-paused)")

    @classmethod
    def from_json(cls, job: str, d: dict) -> Steering:
        """`as_json` read back (the status page's books)."""
        def at(text: str | None) -> datetime | None:
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ") if text else None

        return cls(job, bool(d.get("paused")), d.get("paused_by"), at(d.get("paused_at")), d.get("why"), d.get("held"),
                   at(d.get("held_since")), float(d.get("held_seconds") or 0.0))

    def as_json(self) -> dict:
        return {"paused": self.paused, "paused_by": self.paused_by,
                "paused_at": self.paused_at.strftime("%Y-%m-%dT%H:%M:%SZ") if self.paused_at else None,
                "why": self.why, "held": self.held,
                "held_since": self.held_since.strftime("%Y-%m-%dT%H:%M:%SZ") if self.held_since else None,
                "held_seconds": round(self.held_seconds, 1)}


class SteeringBook:
    """The steering rows and their audit in one target schema."""

    def __init__(self, schema: str | None) -> None:
        md = sa.MetaData()
        self.table = steering_table(schema, md)
        self.audit = steering_audit_table(schema, md)

    def present(self, conn: sa.Connection) -> bool:
        return sa.inspect(conn).has_table(self.table.name, schema=self.table.schema)

    def read(self, conn: sa.Connection, jobs: list[str]) -> dict[str, Steering]:
        """Every job named, steered or not (a job without a row runs freely)."""
        t = self.table
        out = {j: Steering(j) for j in jobs}
        if not jobs:
            return out
        for r in conn.execute(_read_statement(t), {"jobs_": jobs}).mappings():
            out[r["job"]] = Steering(r["job"], bool(r["paused"]), r["paused_by"], r["paused_at"], r["why"], r["held"],
                                     r["held_since"], float(r["held_seconds"] or 0.0))
        return out

    def _row(self, engine: sa.Engine, job: str) -> None:
        """The job's row, made if missing, in a transaction of its own (two makers racing both succeed)."""
        t = self.table
        with engine.connect() as conn:
            self._require(conn)
            if conn.execute(sa.select(t.c.job).where(t.c.job == job)).first() is not None:
                return
        try:
            with engine.begin() as conn:
                conn.execute(sa.insert(t).values(job=job, paused=False, held_seconds=0.0))
        except sa_exc.IntegrityError:
            pass

    def set_paused(self, engine: sa.Engine, job: str, paused: bool, actor: str, why: str | None) -> Steering:
        """Pauses or resumes `job`, audited; returns what it was before."""
        if paused and not (why or "").strip():
            raise UsageError("say why the job is paused: --why TEXT (it is shown to whoever wonders why it stopped)")
        self._row(engine, job)
        with engine.begin() as conn:
            before = self.read(conn, [job])[job]
            now = naive_utc(utcnow())
            values = ({"paused": True, "paused_by": actor, "paused_at": now, "why": why} if paused else
                      {"paused": False, "paused_by": None, "paused_at": None, "why": None})
            conn.execute(sa.update(self.table).where(self.table.c.job == job).values(**values))
            detail = None if paused else (f"paused by {before.paused_by} since {before.paused_at:%Y-%m-%d %H:%M:%S} UTC"
                                          if before.paused and before.paused_at else "was not paused")
            self.record(conn, job, "paused" if paused else "resumed", actor, why, detail)
        return before

    def set_held(self, engine: sa.Engine, job: str, held: str | None) -> None:
        """The running process's back-pressure state. A hold that ends adds its seconds (from
        held_since, so a hold a process took over from an ended one counts whole) to held_seconds."""
        self._row(engine, job)
        with engine.begin() as conn:
            t = self.table
            now = naive_utc(utcnow())
            values: dict = {"held": held}
            if held is None:
                # Read locked: processes ending one hold at once (migrate's tasks) add its seconds
                # once; the later ones find it ended. (SQLite's writes are one at a time already.)
                since = conn.execute(sa.select(t.c.held_since).where(t.c.job == job).with_for_update()).scalar_one_or_none()
                values["held_since"] = None
                if since is not None:
                    values["held_seconds"] = t.c.held_seconds + max(0.0, (now - since).total_seconds())
            else:
                values["held_since"] = sa.func.coalesce(t.c.held_since, now)
            conn.execute(sa.update(t).where(t.c.job == job).values(**values))

    def record(self, conn: sa.Connection, job: str, action: str, actor: str, why: str | None, detail: str | None) -> None:
        """An audit row, and the job's oldest beyond AUDIT_KEEP removed (bounded)."""
        a = self.audit
        conn.execute(sa.insert(a).values(at=naive_utc(utcnow()), job=job, action=action, actor=actor[:128], why=why,
                                         detail=detail))
        cut = conn.execute(sa.select(a.c.id).where(a.c.job == job).order_by(a.c.id.desc())
                           .offset(AUDIT_KEEP).limit(1)).scalar_one_or_none()
        if cut is not None:
            conn.execute(sa.delete(a).where(a.c.job == job, a.c.id <= cut))

    def history(self, conn: sa.Connection, job: str | None, limit: int = 50) -> list[dict]:
        a = self.audit
        stmt = sa.select(a).order_by(a.c.id.desc()).limit(limit)
        if job:
            stmt = stmt.where(a.c.job == job)
        return [dict(r) for r in conn.execute(stmt).mappings()]

    def _require(self, conn: sa.Connection) -> None:
        if not self.present(conn):
            where = f"{self.table.schema}.{STEERING}" if self.table.schema else STEERING
            raise TargetSchemaError(f"the target has no {where!r} table (made by an earlier qbridge); run "
                                    "`qbridge init -c CONFIG` once to add it")


@lru_cache(maxsize=64)
def _read_statement(t: sa.Table) -> sa.Select:
    """Built once a table, not once a pass (bridge.ledger.state says why)."""
    return sa.select(t).where(t.c.job.in_(sa.bindparam("jobs_", expanding=True)))
