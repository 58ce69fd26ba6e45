"""The crash tests of tests/pipeline/test_exactly_once.py, with batches the columnar lane takes
(NGinn's lane_min_rows of new rows a batch, where those tests' 25 stay on the per-row lanes): a real `sync --once`
SIGKILLed before its target commit, and in move mode between its target commit and its legacy
consume, then run again. Every message arrives once, the legacy rows are consumed, the books
balance."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.pipeline.loop import PassStats
from bridge.sources.nginn import NGinnSource
from helpers import kill_at
from tests.pipeline.test_exactly_once import _exactly_once

BATCH = NGinnSource.lane_min_rows  # the smallest batch the lane takes


def _lane_takes_them(b) -> None:
    """Not vacuous: the rows these tests move are ones the lane itself writes."""
    runner = b.runner()
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, BATCH, False)
    outs, *_ = runner._settle(None, source, rows, False, PassStats("MQueue1"), {})
    assert sum(len(t.positions) for t in outs[0].tables) == BATCH


@pytest.mark.slow
def test_sigkill_before_a_lane_batch_commits_loses_and_doubles_nothing(make, tmp_path: Path) -> None:
    b = make(batch_size=BATCH)
    b.insert(b.ready(500))
    _lane_takes_them(b)
    kill_at(b, "before_target_commit", tmp_path)
    assert b.count("Orders") == 0
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 500)
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_sigkill_between_a_lane_batch_commit_and_its_consume_in_move_mode(make, tmp_path: Path) -> None:
    b = make(mode="move", batch_size=BATCH)
    b.insert(b.ready(500))
    _lane_takes_them(b)
    kill_at(b, "after_target_commit", tmp_path)
    assert b.count("Orders") == BATCH  # the target committed...
    assert list(b.subqueues().values()).count("I") == 500  # ...the source did not
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 500)
    assert set(b.subqueues().values()) == {"X"}
    assert b.cli("verify") == 0
