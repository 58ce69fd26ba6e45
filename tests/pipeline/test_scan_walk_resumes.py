"""A copy-mode drain of a scan source whose keyset goes oldest first (BizTalk) walks on after
its last committed batch, where every pass walked the delivered keys again (n²/2b keys read for
a drain of n): each message still exactly once, a key added behind the walk delivered by the
same drain (its last pass walks from the first key again), and a failed pass's drain retried
from the beginning."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import fails_on_call

from bridge.pipeline.passes import Passes
from tests.systems.test_biztalk_source import SMALL, BizTalk, fx, make_bt

QUEUE = "BizTalkServerApplication"


@pytest.fixture(params=["sqlite", "postgres"])
def bt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BizTalk]:
    yield from make_bt(request.param, request, tmp_path, batch_size=5)


def counting_walk(source: Any) -> dict[str, int]:
    """Counts the keys the passes' walks yield (the walk itself is the source's own; a read-ahead's
    walk of the next batch, in its own thread, is not the passes')."""
    seen = {"keys": 0, "walks": 0, "from_start": 0}
    walk = source.iter_aged

    def counted(conn: sa.Connection, after: Any = None, page: int = 10_000) -> Iterator[Any]:
        by_pass = threading.current_thread() is threading.main_thread()
        seen["walks"] += by_pass
        seen["from_start"] += by_pass and after is None
        for item in walk(conn, after, page):
            seen["keys"] += by_pass
            yield item

    source.iter_aged = counted
    return seen


def publish(bt: BizTalk, n: int) -> None:
    for _ in range(n):
        bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])


def delivered_once(bt: BizTalk, n: int) -> None:
    ids = bt.message_ids("Orders")
    assert len(ids) == n and set(ids.values()) == {1}, ids
    assert bt.ledger() == {"delivered": n}


def test_a_drain_walks_each_key_about_once_not_once_a_pass(bt: BizTalk) -> None:
    publish(bt, 60)
    runner = bt.runner()
    seen = counting_walk(runner.sources[QUEUE])
    total = runner.drain(QUEUE)
    assert total.delivered == 60
    delivered_once(bt, 60)
    # 12 passes of 5 (the 12th finds the end) and a last from the first key, which finds nothing
    # new: walking from the start each time read 60 keys a pass (780); walking on reads the
    # first pass's 60, a chunk of a batch and one more in each of the next 11, and the last's 60.
    assert seen["walks"] == 13 and seen["from_start"] == 2
    assert seen["keys"] <= 60 + 11 * 6 + 60, seen


def test_a_key_added_behind_the_walk_comes_in_the_same_drain_once(bt: BizTalk) -> None:
    publish(bt, 20)
    runner = bt.runner()
    seen = counting_walk(runner.sources[QUEUE])
    added: list[uuid.UUID] = []

    def add_behind(stats: Any) -> None:
        if added:
            return
        message, _ = bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        low = uuid.UUID(int=1)  # sorts before every key walked so far
        with bt.source.begin() as conn:
            for name in ("Spool", "MessageParts", f"{QUEUE}Q"):
                t = bt.bt[name]
                conn.execute(t.update().where(t.c.uidMessageID == message).values(uidMessageID=low))
        added.append(low)

    assert runner.drain(QUEUE, on_pass=add_behind).delivered == 21
    assert added and seen["from_start"] == 2
    delivered_once(bt, 21)
    assert runner.drain(QUEUE).delivered == 0
    assert bt.cli("verify") == 0


def test_a_failed_pass_retries_its_drain_from_the_first_key(bt: BizTalk, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that fails after its walk found where its batch ends must not move the next walk's
    start: its batch never committed, and walking on after it would leave the batch behind."""
    publish(bt, 23)
    runner = bt.runner()
    seen = counting_walk(runner.sources[QUEUE])
    fails_on_call(monkeypatch, Passes, "_deliver", 3)
    with pytest.raises(sa.exc.OperationalError):
        runner.drain(QUEUE)
    assert bt.ledger() == {"delivered": 10}
    runner.drain(QUEUE)
    delivered_once(bt, 23)
    assert seen["from_start"] == 3  # the first drain's first pass, the retry's first and its last
