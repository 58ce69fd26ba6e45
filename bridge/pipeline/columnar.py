"""The columnar lane of a batch (issue 37): the rows a source can prove to be the common case are
decoded, mapped and rendered column by column (bridge.sources.columns); the rest of the batch
takes the per-row lanes as before. Both end in the one write and the one set of ledger entries
of the batch's target transaction, so exactly once is the batch's as it was."""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from bridge.ledger.state import LedgerEntry, Quarantined, State
from bridge.mapping import Mapping
from bridge.model import message_ids
from bridge.pipeline.stats import PassStats
from bridge.sources import Source, SourceRow
from bridge.targets.base import Target
from bridge.targets.writer import LaneBatch
from bridge.timefmt import utcnow

log = logging.getLogger("qbridge.batch")

if TYPE_CHECKING:
    from bridge.config import JobConfig


class Batch(Protocol):
    """The runner as the lane uses it: bridge.pipeline.batch.Batch, which imports this module
    (so it is named by what it has, not imported)."""

    job: JobConfig
    target: Target
    state: State
    database: str
    origins: dict[str, int]
    fast_lane: bool
    columnar: bool
    mapping: Mapping
    lane_min_rows: int

    def _process(self, tconn: sa.Connection, source: Source, rows: list[SourceRow], lock: bool, stats: PassStats,
                 known: dict[str, str] | None = None, places: list[int] | None = None
                 ) -> tuple[list[Any], list[LedgerEntry], list[Quarantined], list[Any]]: ...


def takes_columns(runner: Batch, source: Source) -> bool:
    """Whether `source`'s batches try the columnar lane: the fast lane is on, and source and
    target both have the lane."""
    return (runner.fast_lane and runner.columnar and type(source).plain_columns is not Source.plain_columns
            and type(runner.target).plain_columns is not Target.plain_columns
            and not runner.mapping.transforms)  # a plugin takes a whole message: the per-row lanes run it


def process_columns(runner: Batch, tconn: sa.Connection, source: Source, rows: list[SourceRow], lock: bool,
                    stats: PassStats, known: dict[str, str] | None, places: list[int] | None = None
                    ) -> tuple[list[Any], list[LedgerEntry], list[Quarantined], list[Any]]:
    """`Batch._process` with the columnar lane first: the same four results, the write as one
    LaneBatch that keeps the batch's row order (or, when the lane took no row, as `_process`
    gives it, `places` filled as `_process` fills it)."""
    import numpy as np
    import pyarrow.compute as pc

    _one_thread()
    keys = [source.ledger_key(r) for r in rows]
    if known is None:
        known = runner.state.known(tconn, runner.origins[source.queue], keys, ranged=source.cursor == "monotonic")
    take = [i for i, k in enumerate(keys) if k not in known]
    cols = done = None
    # A key twice in one batch (a reverse job's message sent twice) is settled row by row, where
    # the second copy finds the first's outcome.
    if len(take) >= runner.lane_min_rows and len({keys[i] for i in take}) == len(take):
        collecting = gc.isenabled()
        try:
            # The lane parses a batch of bodies and keeps them while the rules run: thousands of
            # acyclic dicts, which the cyclic collector would walk again and again (a third of
            # the time of a parse). None of it can form a cycle; the batch is collected after.
            gc.disable()
            cols = source.plain_columns(rows, take, message_ids(source.system, runner.database, source.queue,
                                                                [keys[i] for i in take]))
            if cols is not None:
                done = runner.target.plain_columns(cols, getattr(source, "translated_headers", frozenset()))
        except Exception:  # a row the lane misjudged must not stop the queue: the per-row lanes settle it
            reported = runner.__dict__.setdefault("_lane_failures", set())
            # Once per queue and process with its trace (a queue whose rows trip it would say so per batch).
            log.log(logging.DEBUG if source.queue in reported else logging.WARNING,
                    "job=%s queue=%s: the columnar lane failed on a batch; its rows take the per-row lanes",
                    runner.job.name, source.queue, exc_info=source.queue not in reported)
            reported.add(source.queue)
            cols = done = None
        finally:
            if collecting:
                gc.enable()
    if cols is None or done is None:
        return runner._process(tconn, source, rows, lock, stats, known, places)
    taken = np.zeros(len(rows), dtype=bool)
    entries: list[LedgerEntry] = []
    delivered: list[Any] = []
    for idx, where in done.delivered:
        entries += [LedgerEntry(cols.mids[i], cols.keys[i], "delivered", where) for i in idx.tolist()]
        delivered.append(idx)
    for idx, reason in done.skipped:
        entries += [LedgerEntry(cols.mids[i], cols.keys[i], "skipped", None, reason) for i in idx.tolist()]
    consume: list[Any] = []
    for idx in [*delivered, *(i for i, _ in done.skipped)]:
        at = cols.positions[idx]
        taken[at] = True
        if lock:
            consume += [rows[i].key for i in at.tolist() if rows[i].consumable]
    lane_delivered = sum(len(i) for i in delivered)
    stats.delivered += lane_delivered
    stats.skipped += sum(len(i) for i, _ in done.skipped)
    rest_at = np.flatnonzero(~taken)
    rest_places: list[int] = []
    before = stats.delivered
    outs, more, quarantined, consumed = runner._process(tconn, source, [rows[i] for i in rest_at.tolist()], lock,
                                                        stats, known, rest_places)
    if lane_delivered:
        oldest = pc.min(cols.sent.take(np.concatenate(delivered))).as_py()
        lag = max(0.0, (utcnow() - oldest).total_seconds())
        stats.lag_seconds = max(lag, stats.lag_seconds or 0.0) if stats.delivered > before else lag
    write = LaneBatch(done.tables, [(int(rest_at[p]), out) for p, out in zip(rest_places, outs)])
    return [write], entries + more, quarantined, consume + consumed


def _one_thread() -> None:
    """One Arrow thread: a process runs one batch at a time on one task slot (a Spark task, a
    sync pass), and the lane's kernels work array by array; Arrow's default pool of a thread per
    core would only compete with the other slots and the database for the same cores. (Arrow is
    imported here, on the first lane batch, so that commands that run none do without it.)"""
    import pyarrow as pa

    if pa.cpu_count() != 1:
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
