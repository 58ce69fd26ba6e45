"""The audit trail of a job's quarantined messages: what replays and discards did, who and why
(`qbridge quarantine history`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from bridge.ledger.state import State
from bridge.timefmt import UTC


def audit_trail(state: State, conn: sa.Connection, job: str, ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """What was done to a job's quarantined messages, oldest first (raw rows left out)."""
    a = state.audit
    if not sa.inspect(conn).has_table(a.name, schema=a.schema):
        return []  # created by the first replay or discard
    stmt = sa.select(*(c for c in a.c if c.name not in ("raw", "id"))).where(a.c.job == job).order_by(a.c.at, a.c.id)
    if ids is not None:
        stmt = stmt.where(a.c.message_id.in_(list(ids)))
    out = []
    for r in conn.execute(stmt).mappings():
        row = {str(k): v for k, v in r.items()}
        for k in ("at", "quarantined_at"):
            row[k] = row[k].replace(tzinfo=UTC).isoformat()
        out.append(row)
    return out
