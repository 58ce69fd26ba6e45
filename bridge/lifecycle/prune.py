"""Ledger entries that can no longer matter, removed (issue 27): `qbridge ledger prune`, and
`qbridge run` on its own schedule.

An entry is there to say "this message went out already" while its source row may still be
read: a scan source's row (an OpenJMS handle, a BizTalk work-queue entry) or a reverse job's
proxy-queue row. Once that row is gone for good (consumed by move mode, by the legacy system's
own receiver, or taken off the queue, and unable to come back: `Source.may_come_back`, which for
BizTalk keeps an entry while its message has a Spool row, as a suspended instance's entry comes
back when it is resumed) and the entry is older than the job's `ledger_retention` (never shorter
than `late_commit_window`), nothing can bring the row back through qbridge, and the entry goes. An entry whose source row is still there stays, whatever its age; quarantined
entries stay (their rows wait in the quarantine); NGinn's increasing keys are kept whole (their
ledger is made of ranges in a later step). The totals are left alone and count what was pruned,
so `qbridge_messages_total` never goes down.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from bridge.ledger.innodb import locks_what_it_scans
from bridge.pipeline.loop import JobRunner
from bridge.timefmt import naive_utc, utcnow

log = logging.getLogger("qbridge.prune")
CHUNK = 1000  # entries looked at, and removed, per transaction


@dataclass
class Pruned:
    job: str
    queue: str
    looked_at: int = 0  # entries older than the retention window, not quarantined
    removed: int = 0  # their source row was gone (with --dry-run: would be removed)
    still_in_source: int = 0  # kept: the source row is there

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prune(runner: JobRunner, dry_run: bool = False, limit: int | None = None) -> list[Pruned]:
    """Removes (or with `dry_run` counts) a job's prunable entries, at most `limit` per queue."""
    runner.check_ledger()
    out = []
    for queue, source in runner.sources.items():
        result = Pruned(runner.job.name, queue)
        out.append(result)
        if source.cursor == "monotonic":
            continue
        cutoff = naive_utc(utcnow() - timedelta(seconds=runner.job.retention_seconds))
        queued = None
        if source.cursor == "queue":  # a proxy queue holds its backlog only: read its keys once
            with runner.source_engine.connect() as sconn:
                queued = set(source.queued_keys(sconn))
        after: tuple[Any, str] | None = None
        while limit is None or result.looked_at < limit:
            page = _old_entries(runner, queue, cutoff, after, CHUNK if limit is None else min(CHUNK, limit - result.looked_at))
            if not page:
                break
            after = page[-1]
            keys = [k for _, k in page]
            present = set(keys) & queued if queued is not None else _in_source(runner, source, keys)
            gone = [k for k in keys if k not in present]
            result.looked_at += len(keys)
            result.still_in_source += len(keys) - len(gone)
            result.removed += len(gone) if dry_run else _remove(runner, queue, gone, cutoff)
        if result.removed and not dry_run:
            log.info("job=%s queue=%s pruned %d ledger entries older than %s whose source rows are gone",
                     runner.job.name, queue, result.removed, runner.job.ledger_retention)
    return out


def _old_entries(runner: JobRunner, queue: str, cutoff: Any, after: tuple[Any, str] | None, n: int) -> list[tuple[Any, str]]:
    """The next `n` (at, key) after `after`, oldest first, of entries older than `cutoff` and not
    quarantined: the (origin, at) index walks the old ones only, a page at a time, with no cursor
    open while entries are removed."""
    l = runner.state.ledger
    stmt = (sa.select(l.c.at, l.c.source_key)
            .where(l.c.origin == runner.origins[queue], l.c.at < cutoff, l.c.job == runner.job.name,
                   l.c.outcome != "quarantined")
            .order_by(l.c.at, l.c.source_key).limit(n))
    if after is not None:
        stmt = stmt.where(sa.or_(l.c.at > after[0], sa.and_(l.c.at == after[0], l.c.source_key > after[1])))
    with runner.target_engine.connect() as conn:
        return [(at, key) for at, key in conn.execute(stmt)]


def _in_source(runner: JobRunner, source: Any, keys: list[str]) -> set[str]:
    """The keys whose scan-source row is still there, or can come back (a suspended BizTalk
    instance's entry, resumed), read without locks."""
    with runner.source_engine.connect() as sconn:
        return source.may_come_back(sconn, keys)


def _remove(runner: JobRunner, queue: str, keys: list[str], cutoff: Any) -> int:
    """Removes the entries and counts them under `pruned` in the totals, in one transaction."""
    if not keys:
        return 0
    l = runner.state.ledger
    with runner.target_engine.begin() as conn:
        # Still old and not quarantined: a replay since the listing may have touched one.
        still = (l.c.at < cutoff, l.c.outcome != "quarantined")
        if locks_what_it_scans(conn):  # beside another job's pass, writing its entries
            one = sa.delete(l).where(l.c.origin == runner.origins[queue], l.c.source_key == sa.bindparam("key_"), *still)
            n = sum(conn.execute(one, {"key_": k}).rowcount for k in keys)
        else:
            n = conn.execute(sa.delete(l).where(l.c.origin == runner.origins[queue], l.c.source_key.in_(keys), *still)).rowcount
        runner.state.totals.add(conn, runner.job.name, queue, runner.origins[queue], Counter({("pruned", None): n}))
        runner.fenced(conn)
    return n
