"""The collector setting of processes that move rows (bridge.pipeline.gc_policy)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from bridge.pipeline import gc_policy


@pytest.fixture()
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_startup_objects_are_frozen_and_young_passes_spaced(collector: None) -> None:
    gc.set_threshold(700, 10, 10)
    gc_policy.for_batches()
    assert gc.get_threshold() == (gc_policy.YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 1000  # the modules this process imported
    # A batch's worth of short-lived containers freed by reference counting triggers no pass.
    passes = gc.get_stats()[0]["collections"]
    for _ in range(20):
        batch = [{"id": i, "headers": {"a": str(i)}, "row": (i, [i])} for i in range(2000)]
        del batch
    assert gc.get_stats()[0]["collections"] == passes


def test_a_higher_threshold_is_kept(collector: None) -> None:
    gc.set_threshold(100_000, 5, 5)
    gc_policy.for_batches()
    assert gc.get_threshold() == (100_000, 5, 5)


def test_cyclic_garbage_is_still_collected(collector: None) -> None:
    gc_policy.for_batches()
    refs = []
    for _ in range(gc_policy.YOUNG_THRESHOLD):  # each pair is a cycle: only the collector frees it
        a, b = Node(), Node()
        a.other, b.other = b, a
        refs.append(weakref.ref(a))
        del a, b
    alive = sum(r() is not None for r in refs)
    assert alive < len(refs), "no collector pass ran"
