"""A batch takes the columnar lane from its source's `lane_min_rows` new rows on, measured per
source by bench/lane_threshold.py (the lane's fixed cost a batch is more than it saves below):
one row fewer and the per-row lanes write it; a runner's own number (tests set 1) overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.pipeline.loop import PassStats
from bridge.sources.base import Source
from bridge.sources.biztalk import BizTalkSource
from bridge.sources.nginn import NGinnSource
from bridge.sources.openjms import OpenJMSSource
from bridge.targets.writer import LaneBatch
from helpers import sqlite_nginn
from tests.pipeline.test_columnar_lane_decoded import jms_rows
from tests.pipeline.test_columnar_lane_groups import _jms, _jms_store, _store


def _by_lane(runner: Any, queue: str, rows: list[Any]) -> int:
    """How many of `rows` the columnar lane wrote (0: the per-row lanes took the batch)."""
    source = runner.sources[queue]
    outs, *_ = runner._settle(None, source, [r._replace(values=dict(r.values)) for r in rows], False,
                               PassStats(queue), {}, [])
    return sum(len(t.positions) for t in outs[0].tables) if outs and isinstance(outs[0], LaneBatch) else 0


def test_each_source_has_a_threshold_of_its_own() -> None:
    # The decoded lane (OpenJMS, BizTalk) saves only the envelope's share of a row, and a BizTalk
    # row's decode is the larger; NGinn's lane saves its checks too.
    assert Source.lane_min_rows < NGinnSource.lane_min_rows < OpenJMSSource.lane_min_rows < BizTalkSource.lane_min_rows


def test_an_nginn_batch_takes_the_lane_from_its_threshold_on(tmp_path: Path) -> None:
    least = NGinnSource.lane_min_rows
    b = sqlite_nginn(tmp_path, [])
    b.insert(b.ready(least))
    runner = b.runner()
    assert runner.lane_min_rows is None  # the source's own
    with runner.source_engine.connect() as conn:
        rows = list(runner.sources["MQueue1"].fetch_after(conn, None, least, False))
    assert len(rows) == least
    assert _by_lane(runner, "MQueue1", rows) == least
    assert _by_lane(runner, "MQueue1", rows[:-1]) == 0
    runner.lane_min_rows = 1
    assert _by_lane(runner, "MQueue1", rows[:2]) == 2


def test_an_openjms_batch_takes_the_lane_from_its_threshold_on(tmp_path: Path) -> None:
    least = OpenJMSSource.lane_min_rows
    j = _jms_store(tmp_path)
    _store(j, [_jms(i, f"corr-{i}") for i in range(least)])
    runner, rows = jms_rows(j, "orders")
    assert len(rows) == least
    assert _by_lane(runner, "orders", rows) == least
    assert _by_lane(runner, "orders", rows[:-1]) == 0
