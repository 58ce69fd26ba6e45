"""The columnar lane of a batch (issue 37): the rows a source can prove to be the common case are
decoded, mapped and rendered column by column (bridge.sources.columns); the rest of the batch
takes the per-row lanes as before. Both end in the one write and the one set of ledger entries
of the batch's target transaction, so exactly once is the batch's as it was. The lane settles its
share and says which rows it took; Batch gives the rest to the per-row lanes and writes both."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from bridge.ledger.lane_entries import LaneEntries, LaneGroup
from bridge.mapping import Mapping
from bridge.model import message_ids
from bridge.pipeline.read_ahead import NOT_MADE, ReadAhead
from bridge.sources import Source, SourceRow
from bridge.sources.fetched import consumable_of, keys_of, ledger_keys
from bridge.targets.base import Target
from bridge.targets.writer import LaneBatch

log = logging.getLogger("qbridge.batch")

if TYPE_CHECKING:
    import numpy as np

    from bridge.config import JobConfig


class Batch(Protocol):
    """The runner as the lane uses it (bridge.pipeline.batch.Batch, which imports this module)."""

    job: JobConfig
    target: Target
    database: str
    fast_lane: bool
    columnar: bool
    mapping: Mapping
    lane_min_rows: int | None
    read_ahead: ReadAhead


@dataclass
class Lane:
    """What the columnar lane settled of a batch: the batch's other rows are the per-row lanes'."""

    taken: np.ndarray  # bool, a batch row: the lane delivered or skipped it
    entries: LaneEntries  # its rows' ledger entries, as columns
    consume: list[Any]  # the keys of its rows move mode may consume
    tables: Any  # the lane's part of the write (LaneBatch's tables)
    delivered: int
    skipped: int
    oldest: datetime | None  # the earliest time sent of a row it delivered (for the lag)

    def write(self, rest_at: np.ndarray, rest_places: Sequence[int], outs: Sequence[Any]) -> LaneBatch:
        """The batch's one write, in batch order: the lane's rows and what the per-row lanes made
        of the rest (`outs`, each of the row `rest_at[rest_places[i]]`)."""
        return LaneBatch(self.tables, [(int(rest_at[p]), out) for p, out in zip(rest_places, outs)])


def takes_columns(runner: Batch, source: Source) -> bool:
    """Whether `source`'s batches try the columnar lane: the fast lane is on, and source and
    target both have the lane."""
    return (runner.fast_lane and runner.columnar and type(source).plain_columns is not Source.plain_columns
            and type(runner.target).plain_columns is not Target.plain_columns
            and not runner.mapping.transforms)  # a plugin takes a whole message: the per-row lanes run it


def lane(runner: Batch, source: Source, rows: Sequence[SourceRow], keys: Sequence[str], known: dict[str, str],
         lock: bool) -> Lane | None:
    """The rows of the batch (with their ledger keys `keys`; `known`: what the ledger holds of
    them) the columnar lane can prove to be the common case, decoded, mapped and rendered column
    by column; None when it takes none (the per-row lanes then take the whole batch)."""
    import numpy as np
    import pyarrow.compute as pc

    _one_thread()
    take = [i for i, k in enumerate(keys) if k not in known]
    # A key twice in one batch (a reverse job's message sent twice) is settled row by row, where
    # the second copy finds the first's outcome.
    if len(take) < _least(runner, source) or len({keys[i] for i in take}) != len(take):
        return None
    with _collector_paused():
        try:
            # Made with the rows by a read-ahead, while the last pass committed, when the lane takes every row.
            made = runner.read_ahead.columns(source.queue, rows) if len(take) == len(rows) else NOT_MADE
            cols, done = (NOT_MADE, NOT_MADE) if made is NOT_MADE else made
            if cols is NOT_MADE:
                cols = source.plain_columns(rows, take, message_ids(source.system, runner.database, source.queue,
                                                                    [keys[i] for i in take]))
            if done is NOT_MADE:
                done = None if cols is None else _target_columns(runner, source, cols)
        except Exception:  # a row the lane misjudged must not stop the queue: the per-row lanes settle it
            reported = runner.__dict__.setdefault("_lane_failures", set())
            # Once per queue and process with its trace (a queue whose rows trip it would say so per batch).
            log.log(logging.DEBUG if source.queue in reported else logging.WARNING,
                    "job=%s queue=%s: the columnar lane failed on a batch; its rows take the per-row lanes",
                    runner.job.name, source.queue, exc_info=source.queue not in reported)
            reported.add(source.queue)
            return None
    if cols is None or done is None:
        return None
    taken = np.zeros(len(rows), dtype=bool)
    delivered = [idx for idx, _ in done.delivered]
    entries = LaneEntries(cols.mids, cols.keys, [LaneGroup(idx, "delivered", where) for idx, where in done.delivered]
                          + [LaneGroup(idx, "skipped", None, reason) for idx, reason in done.skipped])
    consume: list[Any] = []
    row_keys, consumable = keys_of(rows), consumable_of(rows)
    for idx in [*delivered, *(i for i, _ in done.skipped)]:
        at = cols.positions[idx]
        taken[at] = True
        if lock:
            consume += [row_keys[i] for i in at.tolist() if consumable[i]]
    n_delivered = sum(len(i) for i in delivered)
    oldest = pc.min(cols.sent.take(np.concatenate(delivered))).as_py() if n_delivered else None
    return Lane(taken, entries, consume, done.tables, n_delivered, sum(len(i) for i, _ in done.skipped), oldest)


def ahead_columns(runner: Batch, source: Source, rows: Sequence[SourceRow]) -> Any:
    """The lane's columns of every row of a batch read ahead (pipeline/read_ahead.py), made as
    `lane` makes them when the ledger knows none of the rows: (the source's columns, what the
    target made of them, or NOT_MADE where a mapping's rules leave it to the pass), or NOT_MADE
    where the lane would take none.

    The target's part is the group examples' envelopes and the rows' header texts: a function of
    the columns and the runner's mapping, which a reload does not change under a runner (it
    builds another). Not with rules: a [[ttbr]] rule's expiry counts from when its envelope is
    made, which is the pass's own time, not the read-ahead's."""
    if not takes_columns(runner, source):
        return NOT_MADE
    keys = ledger_keys(source, rows)
    if len(keys) < _least(runner, source) or len(set(keys)) != len(keys):
        return NOT_MADE
    _one_thread()
    with _collector_paused():  # the lane's own batch is not running: it ends before its write
        cols = source.plain_columns(rows, range(len(rows)), message_ids(source.system, runner.database, source.queue, keys))
        if cols is None or runner.mapping.has_rules:
            return cols, NOT_MADE
        return cols, _target_columns(runner, source, cols)


def _target_columns(runner: Batch, source: Source, cols: Any) -> Any:
    return runner.target.plain_columns(cols, getattr(source, "translated_headers", frozenset()))


def _least(runner: Batch, source: Source) -> int:
    """New rows a batch needs for the lane: the source's measured threshold, or the runner's own."""
    return source.lane_min_rows if runner.lane_min_rows is None else runner.lane_min_rows


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic collector off while a batch's bodies are parsed and kept for the rules: thousands
    of acyclic dicts, which it would walk again and again (a third of the time of a parse). None
    of it can form a cycle; the batch is collected after. On again only where it was on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _one_thread() -> None:
    """One Arrow thread: a process runs one batch at a time on one task slot (a Spark task, a
    sync pass), and the lane's kernels work array by array; Arrow's default pool of a thread per
    core would only compete with the other slots and the database for the same cores. (Arrow is
    imported here, on the first lane batch, so that commands that run none do without it.)"""
    import pyarrow as pa

    if pa.cpu_count() != 1:
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
