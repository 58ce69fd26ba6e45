"""Retries follow progress (issue 29): the attempts and the back-off belong to a batch, and start
afresh once one commits; a run that meets many recovered blips finishes, paying only for them."""

from __future__ import annotations

import pytest

from bridge.errors import RetryableError
from bridge.retry import with_backoff


class Blip(RetryableError):
    pass


def test_the_count_and_the_delay_start_afresh_after_progress() -> None:
    done, slept, calls = [0], [], [0]

    def work() -> str:
        calls[0] += 1
        if done[0] < 10:
            done[0] += 1  # one batch commits, then the connection drops
            raise Blip("connection cut")
        return "drained"

    assert with_backoff(work, "drain", attempts=2, sleep=slept.append, progress=lambda: done[0]) == "drained"
    assert calls[0] == 11 and slept == [0.1] * 10  # ten blips, each paid once, at the blip's wait


def test_without_progress_the_budget_runs_out() -> None:
    slept = []
    with pytest.raises(Blip):
        with_backoff(lambda: (_ for _ in ()).throw(Blip("down")), "drain", attempts=3, sleep=slept.append, progress=lambda: 0)
    assert slept == [0.1, 1.0]  # a blip's wait, then the back-off proper


def test_a_drain_that_meets_more_blips_than_retries_finishes(make, monkeypatch) -> None:
    """sync --once over 30 batches, every third pass failing once at its target commit: with a
    budget of 2 attempts per batch it finishes, every message once."""
    from rich.console import Console

    from bridge.pipeline import inprocess
    from helpers import flaky_passes

    b = make(batch_size=10)
    b.insert(b.ready(300))
    runner = b.runner()
    calls = flaky_passes(monkeypatch, 3, inprocess)
    inprocess.run_inprocess([runner], Console(quiet=True), attempts=2)
    assert b.count("Orders") == 300 and len(b.message_ids("Orders")) == 300
    assert calls["n"] > 40
