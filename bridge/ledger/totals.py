"""Per-queue totals kept beside the ledger, so that `status`, `/metrics` and the status page
cost the same on day 90 as on day 1 (GUIDE guarantee 6).

Every batch adds its counts as new rows (one per outcome, and per rule for skips) in the same
transaction as its ledger entries: concurrent Spark tasks never wait on one hot row. A pass
folds a queue's rows into one per outcome and rule now and then, under the queue's checkpoint
lock, which serialises the folders; it deletes exactly the rows it read, by id, so a row that a
Spark task commits meanwhile (whatever its id) is folded the next time. Reading is a SUM over a
handful of rows. The totals only ever grow: pruning ledger entries leaves them alone, so
`qbridge_messages_total` never goes down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from bridge.ledger.innodb import locks_what_it_scans
from bridge.targets.bulk import insert_values
from bridge.timefmt import naive_utc, utcnow

TOTALS = "qbridge_totals"
OUTCOMES = ("delivered", "skipped", "quarantined")
PRUNED = "pruned"  # entries removed from the ledger (bridge.lifecycle.prune): counted, never taken off an outcome
# What left an outcome, counted apart so that what ever happened only grows (issue 46): a replay
# or discard takes a message out of quarantine, a rollback out of delivered. Prometheus's
# qbridge_messages_total{outcome} is an outcome's count now plus what left it.
RELEASED = "released"  # quarantined messages replayed or discarded
WITHDRAWN = "withdrawn"  # delivered messages a rollback withdrew
LEFT = {"quarantined": RELEASED, "delivered": WITHDRAWN}
COLUMNS = ("origin", "job", "queue", "outcome", "reason", "n", "at")
FOLD_EVERY = 50  # passes of a queue between folds: at most ~50 batches' rows wait to be folded


def totals_table(schema: str | None, metadata: sa.MetaData, name: str = TOTALS) -> sa.Table:
    return sa.Table(
        name, metadata,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("origin", sa.BigInteger(), nullable=False),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("outcome", sa.String(12), nullable=False),
        sa.Column("reason", sa.String(500)),  # the mapping rule, for skips only
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Index(f"ix_{name}_origin", "origin", "job"),
        schema=schema,
    )


def counted(outcome: str, reason: str | None) -> tuple[str, str | None]:
    """The (outcome, rule) a total is kept under: the rule for skips only, 500 characters as the ledger keeps it."""
    return (outcome, (reason or None) and reason[:500]) if outcome == "skipped" else (outcome, None)


class Totals:
    """The totals of one state schema."""

    def __init__(self, table: sa.Table) -> None:
        self.table = table

    def add(self, conn: sa.Connection, job: str, queue: str, origin: int, deltas: Counter[tuple[str, str | None]],
            keep_zero: bool = False) -> None:
        """Adds (outcome, rule) -> n; a negative n moves a message out of an outcome (a replay)."""
        now = naive_utc(utcnow())
        rows = [(origin, job, queue, outcome, reason, n, now) for (outcome, reason), n in deltas.items() if n or keep_zero]
        if rows:
            insert_values(conn, self.table, COLUMNS, rows)

    def counts(self, conn: sa.Connection, job: str, origins: Iterable[int]) -> dict[str, dict[str, int]]:
        """queue -> outcome (and `pruned`, `released`, `withdrawn`) -> count."""
        t = self.table
        out: dict[str, dict[str, int]] = {}
        stmt = (sa.select(t.c.queue, t.c.outcome, sa.func.sum(t.c.n)).where(t.c.origin.in_(list(origins)), t.c.job == job)
                .group_by(t.c.queue, t.c.outcome))
        for queue, outcome, n in conn.execute(stmt):
            out.setdefault(queue, {**dict.fromkeys(OUTCOMES, 0), PRUNED: 0, RELEASED: 0, WITHDRAWN: 0})[outcome] = int(n)
        return out

    def skip_reasons(self, conn: sa.Connection, job: str, origins: Iterable[int]) -> dict[str, dict[str, int]]:
        """queue -> the mapping rule that skipped messages -> how many."""
        t = self.table
        stmt = (sa.select(t.c.queue, t.c.reason, sa.func.sum(t.c.n))
                .where(t.c.origin.in_(list(origins)), t.c.job == job, t.c.outcome == "skipped")
                .group_by(t.c.queue, t.c.reason))
        out: dict[str, dict[str, int]] = {}
        for queue, reason, n in conn.execute(stmt):
            if int(n):
                out.setdefault(queue, {})[reason or "(no reason recorded)"] = int(n)
        return out

    def fold(self, conn: sa.Connection, job: str, queue: str, origin: int) -> int:
        """Folds a queue's rows into one per (outcome, rule), in the caller's transaction, which
        holds the queue's checkpoint lock; returns how many rows it removed."""
        t = self.table
        rows = conn.execute(sa.select(t.c.id, t.c.outcome, t.c.reason, t.c.n)
                            .where(t.c.origin == origin, t.c.job == job)).all()
        sums: Counter[tuple[str, str | None]] = Counter()
        for _, outcome, reason, n in rows:
            sums[(outcome, reason)] += int(n)
        if len(rows) <= len(sums):
            return 0
        ids = [r[0] for r in rows]
        if locks_what_it_scans(conn):  # a quarantine replay's message adds its totals, then waits on this checkpoint
            conn.execute(sa.delete(t).where(t.c.id == sa.bindparam("id_")), [{"id_": i} for i in ids])
        else:
            for start in range(0, len(ids), 1000):
                conn.execute(sa.delete(t).where(t.c.id.in_(ids[start:start + 1000])))
        # An outcome a replay emptied keeps its row at 0, so counts still list it.
        self.add(conn, job, queue, origin, sums, keep_zero=True)
        return len(rows) - len(sums)

    def seed(self, ledger: sa.Table) -> sa.Executable:
        """INSERT ... SELECT of the totals an existing ledger holds (`qbridge init` when it adds them)."""
        l = ledger
        reason = sa.case((l.c.outcome == "skipped", l.c.reason), else_=sa.null())
        select = (sa.select(l.c.origin, l.c.job, l.c.queue, l.c.outcome, reason, sa.func.count(), sa.func.max(l.c.at))
                  .group_by(l.c.origin, l.c.job, l.c.queue, l.c.outcome, reason))
        return sa.insert(self.table).from_select(list(COLUMNS), select)


def batch_counts(entries: Sequence[Any]) -> Counter[tuple[str, str | None]]:
    """A batch's ledger entries counted by (outcome, rule)."""
    return Counter(counted(e.outcome, e.reason) for e in entries)
