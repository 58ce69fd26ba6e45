"""Id gaps behind the cursor: where a row may still commit late (GUIDE guarantee 3).

An identity column hands out ids at insert time, but transactions commit in any order, so a
reader that has seen id 6 may not yet see id 5. qbridge remembers every such hole as a gap and
re-reads it on each pass until a row appears there or the late-commit window has passed (the
id was rolled back, or skipped by the identity cache).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    lo: int
    hi: int
    since: float  # epoch seconds when first seen

    def to_json(self) -> list[float]:
        return [self.lo, self.hi, self.since]

    @classmethod
    def from_json(cls, value: list[float]) -> Gap:
        return cls(int(value[0]), int(value[1]), float(value[2]))


def holes(prev_high: int | None, keys: list[int], now: float) -> list[Gap]:
    """Gaps between the previous cursor and the ascending keys just read."""
    found: list[Gap] = []
    last = prev_high
    for key in keys:
        if last is not None and key > last + 1:
            found.append(Gap(last + 1, key - 1, now))
        last = key
    return found


def fill(gaps: Iterable[Gap], keys: Iterable[int]) -> list[Gap]:
    """Gaps left once the given keys have been read: a gap with a key in it splits in two.
    Each gap takes only the keys inside it (bisect), so thousands of gaps cost little."""
    found = sorted(set(keys))
    out: list[Gap] = []
    for gap in gaps:
        lo = gap.lo
        for key in found[bisect_left(found, gap.lo):bisect_right(found, gap.hi)]:
            if key > lo:
                out.append(Gap(lo, key - 1, gap.since))
            lo = key + 1
        if lo <= gap.hi:
            out.append(Gap(lo, gap.hi, gap.since))
    return out


def expire(gaps: Iterable[Gap], now: float, window: float) -> tuple[list[Gap], list[Gap]]:
    """(still open, given up): a gap open longer than the window will not fill any more."""
    kept: list[Gap] = []
    dropped: list[Gap] = []
    for gap in gaps:
        (dropped if now - gap.since >= window else kept).append(gap)
    return kept, dropped
