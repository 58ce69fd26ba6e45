"""The quarantine's rows as operators pick them: by message id, failure group, queue, type and
time, in pages, and counted by group (bridge.ledger.failure_groups names the groups)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa

from bridge.timefmt import UTC


@dataclass(frozen=True)
class QuarantineFilter:
    """Which quarantined messages an operator means: a failure group, a legacy queue, a type
    (matched against the kept legacy row), quarantined since a time."""

    group: str | None = None
    queue: str | None = None
    mentions: str | None = None  # text the kept raw row holds (`--type`)
    since: datetime | None = None  # naive UTC

    def clauses(self, q: sa.Table) -> list[sa.ColumnElement[bool]]:
        out = []
        if self.group:
            out.append(q.c.grp == self.group)
        if self.queue:
            out.append(q.c.queue == self.queue)
        if self.mentions:
            out.append(q.c.raw.contains(self.mentions, autoescape=True))
        if self.since is not None:
            out.append(q.c.at >= self.since)
        return out

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.group, self.queue, self.mentions, self.since))


def quarantined(q: sa.Table, conn: sa.Connection, job: str, ids: Sequence[str] | None = None, raw: bool = True,
                newest: int | None = None, where: QuarantineFilter | None = None,
                after: tuple[datetime, str, str] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """A job's quarantined rows (all, or these message ids or source keys, or those `where` picks), oldest
    first, raw rows parsed; `raw=False` leaves the raw rows in the database, `newest=N` takes
    the N newest, newest first; `after` (at, queue, source key) and `limit` page through them."""
    order = (q.c.at, q.c.queue, q.c.source_key)  # a queue's rows of one batch in their order; unique in a job
    stmt = sa.select(*(c for c in q.c if raw or c.name != "raw")).where(q.c.job == job)
    if ids is not None:  # a message id, or the source key `list` shows beside it (issue 46)
        stmt = stmt.where(sa.or_(q.c.message_id.in_(list(ids)), q.c.source_key.in_(list(ids))))
    if where is not None:
        stmt = stmt.where(*where.clauses(q))
    if after is not None:  # keyset paging, spelled out (SQL Server has no row values)
        at, queue, key = after
        stmt = stmt.where(sa.or_(q.c.at > at, sa.and_(q.c.at == at, q.c.queue > queue),
                                 sa.and_(q.c.at == at, q.c.queue == queue, q.c.source_key > key)))
    stmt = stmt.order_by(*order) if newest is None else stmt.order_by(*(c.desc() for c in order)).limit(newest)
    if limit is not None:
        stmt = stmt.limit(limit)
    out = []
    for r in conn.execute(stmt).mappings():
        row = {str(k): v for k, v in r.items()}
        if raw:
            row["raw"] = orjson.loads(row["raw"])
        row["at"] = row["at"].replace(tzinfo=UTC).isoformat()
        out.append(row)
    return out

def failure_groups(q: sa.Table, conn: sa.Connection, job: str, where: QuarantineFilter | None = None) -> list[dict[str, Any]]:
    """A job's quarantine by failure group, largest first: queue, count, first and last seen,
    and one message's reason as the sample."""
    stmt = (sa.select(q.c.grp, q.c.queue, sa.func.count().label("count"), sa.func.min(q.c.at).label("first"),
                      sa.func.max(q.c.at).label("last"), sa.func.min(q.c.reason).label("sample"))
            .where(q.c.job == job).group_by(q.c.grp, q.c.queue).order_by(sa.func.count().desc(), q.c.grp))
    if where is not None:
        stmt = stmt.where(*where.clauses(q))
    # By attribute, "count" is Row's Sequence.count to a type checker (the column only at run time).
    return [{"group": r.grp, "queue": r.queue, "count": int(r._mapping["count"]),
             "first_seen": r.first.replace(tzinfo=UTC).isoformat(), "last_seen": r.last.replace(tzinfo=UTC).isoformat(),
             "sample_reason": r.sample} for r in conn.execute(stmt)]
