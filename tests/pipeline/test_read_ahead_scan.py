"""A copy-mode drain of a scan source whose walk goes oldest first (BizTalk) fetches its next batch
while a pass writes and commits (pipeline/read_ahead.py): the keys after this batch's last in the
walk's order. The next pass still walks and looks its keys up in the ledger under its lock, and
takes the rows only when its batch is exactly the keys read ahead. OpenJMS's reserve never does. Each test checks that
every message arrives once, and that the read-ahead was (or was not) what the pass took."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.pipeline import passes, read_ahead
from bridge.pipeline.loop import PassStats
from tests.pipeline.test_read_ahead import _drain as drain_of
from tests.pipeline.test_read_ahead import _in_read_ahead
from tests.systems.test_biztalk_source import MAPPING, SMALL, BizTalk, fx, make_bt
from tests.systems.test_openjms_source import Jms, make_jms

HOST = "BizTalkServerApplication"
TABLES = ("Spool", "MessageParts", "Parts", f"{HOST}Q")


@pytest.fixture()
def bt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BizTalk]:
    yield from make_bt("postgres", request, tmp_path, batch_size=5)


def _publish(bt: BizTalk, n: int) -> None:
    for _ in range(n):
        bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])


def _drain(runner: Any, queue: str = HOST, **kwargs: Any) -> list[PassStats]:
    return drain_of(runner, queue, **kwargs)


def _once(b: Any, n: int) -> None:
    ids = b.message_ids("Orders")
    assert len(ids) == n and set(ids.values()) == {1}, ids.most_common(3)
    assert b.ledger() == {"delivered": n}


def _transport_rows(b: Any) -> list[tuple[Any, ...]]:
    return sorted((r["headers"]["NServiceBus.MessageId"], r["headers"], bytes(r["body"])) for r in b.rows("Orders"))


def test_a_biztalk_drain_takes_each_read_ahead_and_writes_what_it_wrote_without(
        bt: BizTalk, tmp_path: Path, pg_server: str, pg_schema2: str) -> None:
    _publish(bt, 23)
    runner = bt.runner()
    runner.lane_min_rows = 1  # the columnar lane at 5 rows: it makes its own columns of rows read ahead
    done = _drain(runner)
    # Four passes walk on after the last; the fifth finds the end, and the last walks from the first key.
    assert [p.read for p in done] == [5, 5, 5, 5, 3, 0]
    _once(bt, 23)
    # Passes 2 to 5 fetched nothing themselves; a scan's read-ahead makes no columns.
    assert runner.read_ahead.taken == 4 and runner.read_ahead.columns_taken == 0

    # The same store drained by a runner that never reads ahead: the same transport rows, byte for byte.
    (tmp_path / "off").mkdir()
    other = BizTalk(tmp_path / "off", pg_server, pg_server, source_schema=pg_schema2, target_schema=pg_schema2,
                    system="biztalk", queues=[HOST], mapping=MAPPING, batch_size=5)
    try:
        other.seed()
        assert other.cli("init") == 0
        with bt.source.connect() as conn:
            copied = {n: [dict(r._mapping) for r in conn.execute(sa.select(bt.bt[n]))] for n in TABLES}
        with other.source.begin() as conn:
            for n in TABLES:
                conn.execute(other.bt[n].insert(), copied[n])
        off = other.runner()
        off.lane_min_rows = 1
        off.read_ahead.on = False
        assert [p.read for p in _drain(off)] == [5, 5, 5, 5, 3, 0]
        assert off.read_ahead.taken == 0
        assert _transport_rows(other) == _transport_rows(bt)
    finally:
        other.dispose()


def test_an_entry_another_runner_delivered_meanwhile_is_not_taken_twice(bt: BizTalk) -> None:
    _publish(bt, 20)
    runner, other = bt.runner(), bt.runner()
    calls = []

    def before_pass() -> None:
        calls.append(1)
        if len(calls) == 2:  # the first pass fetched ahead the next five; another runner delivers them first
            assert other.run_pass(HOST).delivered == 5

    done = _drain(runner, before_pass=before_pass)
    # The second pass's walk found those five in the ledger: its batch was the five after them,
    # fetched itself. The third took the read-ahead the second began.
    assert [p.read for p in done] == [5, 5, 5, 0] and all(p.already == 0 for p in done)
    assert runner.read_ahead.taken == 1
    _once(bt, 20)


def test_a_biztalk_read_ahead_that_fails_leaves_the_pass_to_fetch(bt: BizTalk, monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(bt, 17)
    runner = bt.runner()

    def reset() -> None:
        raise sa.exc.OperationalError("fetch", {}, Exception("connection reset"))

    _in_read_ahead(monkeypatch, runner.sources[HOST], "fetch_keys", reset)
    assert [p.read for p in _drain(runner)] == [5, 5, 5, 2, 0]
    assert runner.read_ahead.taken == 0
    _once(bt, 17)


def test_a_stuck_biztalk_read_ahead_is_left_behind_and_the_pass_fetches(
        bt: BizTalk, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _publish(bt, 12)
    runner = bt.runner()
    monkeypatch.setattr(read_ahead, "STUCK_SECONDS", 0.3)
    _in_read_ahead(monkeypatch, runner.sources[HOST], "iter_aged", lambda: time.sleep(1.5))  # its walk hangs
    assert [p.read for p in _drain(runner)] == [5, 5, 2, 0]
    assert runner.read_ahead.taken == 0
    assert "a read-ahead has not ended in 0 s" in caplog.text
    _once(bt, 12)


def test_a_scan_read_ahead_begun_by_a_pass_that_never_wrote_is_taken_at_once(bt: BizTalk) -> None:
    """A scan's fetch waits for the pass's write to begin (beside the pass's decoding it would only
    take turns with it on the GIL); a pass that never got there must not leave the next one
    waiting for a write that never comes."""
    _publish(bt, 8)
    runner = bt.runner()
    source = runner.sources[HOST]
    with bt.source.connect() as conn:
        keys = [k for k, _ in source.iter_aged(conn)][:5]
    runner.read_ahead.draining.add(HOST)
    runner.read_ahead.start_keys(source, lambda conn: keys)
    began = time.monotonic()
    rows = runner.read_ahead.take(HOST, keys)
    assert time.monotonic() - began < 5 and [r.key for r in rows] == keys


def test_a_move_mode_scan_drain_never_reads_ahead(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    for b in make_bt("postgres", request, tmp_path, batch_size=5, mode="move"):
        _publish(b, 12)
        runner = b.runner()
        assert sum(p.delivered for p in _drain(runner)) == 12
        assert runner.read_ahead.taken == 0 and b.count_rows(f"{HOST}Q") == 0
        _once(b, 12)


@pytest.fixture()
def jms(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Jms]:
    monkeypatch.setattr(passes, "SCAN_RESERVE", 9)  # a walk keeps three batches of three
    yield from make_jms("postgres", request, tmp_path, pg_server, pg_schema, batch_size=3, queues=["orders"])


def test_an_openjms_drain_never_reads_ahead(jms: Jms) -> None:
    """Its passes take their batches from a reserve and look at the store again only in their own
    fetch: rows fetched ahead would deliver a handle acknowledged since (the review's tests in
    tests/review/test_scan_read_ahead_review.py)."""
    for i in range(30):  # message ids sort the other way round from their accept times
        jms.queue_message(f"ID:m-{i:02d}", accepted=1_141_916_400_000 + 1000 * (30 - i))
    runner = jms.runner()
    ahead: list[Any] = []
    source = runner.sources["orders"]
    fetch = source.fetch_keys

    def fetch_keys(conn: sa.Connection, keys: Any, lock: bool) -> Any:
        if threading.current_thread() is not threading.main_thread():
            ahead.extend(keys)
        return fetch(conn, keys, lock)

    source.fetch_keys = fetch_keys
    assert sum(p.delivered for p in _drain(runner, "orders")) == 30
    assert runner.read_ahead.taken == 0 and ahead == []
    ids = jms.message_ids("Orders")
    assert len(ids) == 30 and set(ids.values()) == {1}
    assert jms.cli("verify") == 0
