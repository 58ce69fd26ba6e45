"""A batch's ledger entries with the columnar lane's share as columns (issue 49): the lane settles
rows group by group, one outcome, target and reason a group, so its entries are the group's row
indices over the batch's message ids and keys, not a LedgerEntry a row. The per-row lanes' entries
of the same batch ride along (`rest`). `State.record` writes both: a range ledger's bits from the
keys as one integer array a group, the totals a count a group; a per-message ledger's rows are
made straight from the columns. Iterated, it is the LedgerEntry of each row, the lane's first in
group order, as the lane listed them before."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from bridge.ledger.ledger_entry import LedgerEntry
from bridge.ledger.totals import batch_counts, counted

__all__ = ["LaneEntries", "LaneGroup"]


@dataclass(frozen=True)
class LaneGroup:
    """Rows of the lane with one outcome: `rows` index the entries' `mids` and `keys`."""

    rows: np.ndarray
    outcome: str  # "delivered" or "skipped"
    target: str | None
    reason: str | None = None


@dataclass
class LaneEntries:
    """The ledger entries of a batch whose columnar lane took rows (see the module's docstring)."""

    mids: Sequence[str]  # the lane's rows' message ids
    keys: Sequence[str]  # their ledger (source) keys
    groups: list[LaneGroup]
    rest: list[Any] = field(default_factory=list)  # the per-row lanes' LedgerEntry of the batch

    def with_rest(self, rest: list[Any]) -> LaneEntries:
        return LaneEntries(self.mids, self.keys, self.groups, rest)

    def __len__(self) -> int:
        return sum(len(g.rows) for g in self.groups) + len(self.rest)

    def __iter__(self) -> Iterator[LedgerEntry]:
        mids, keys = self.mids, self.keys
        for g in self.groups:
            outcome, target, reason = g.outcome, g.target, g.reason
            for i in g.rows.tolist():
                yield LedgerEntry(mids[i], keys[i], outcome, target, reason)
        yield from self.rest

    def counts(self) -> Counter[tuple[str, str | None]]:
        """batch_counts of every entry, a group's by its size."""
        out = batch_counts(self.rest)
        for g in self.groups:
            out[counted(g.outcome, g.reason)] += len(g.rows)
        return out

    def bits(self) -> Iterator[tuple[np.ndarray, str]]:
        """(the integer keys, their outcome) of each group: a range ledger's keys, which are
        integers (as `int(source_key)` reads them a row)."""
        keys = self.keys
        for g in self.groups:
            yield np.fromiter((int(keys[i]) for i in g.rows.tolist()), dtype=np.int64, count=len(g.rows)), g.outcome

    def has_reason(self, test: Callable[[str], bool]) -> bool:
        """Whether a lane group's reason passes `test`."""
        return any(g.reason and test(g.reason) for g in self.groups)

    def ledger_rows(self, origin: int, job: str, queue: str, now: datetime, text: Callable[[str], str]
                    ) -> list[tuple[Any, ...]]:
        """The lane's rows of a per-message ledger (LEDGER_COLUMNS' order), made from the columns."""
        mids, keys = self.mids, self.keys
        out: list[tuple[Any, ...]] = []
        for g in self.groups:
            outcome, target = g.outcome, g.target
            reason = (g.reason or None) and text(g.reason)[:500]
            out += [(origin, keys[i], str(mids[i]), job, queue, outcome, target, reason, now) for i in g.rows.tolist()]
        return out
