"""A copy-mode drain of a monotonic queue reads its next batch while a pass commits
(pipeline/read_ahead.py): the next pass takes it only when its checkpoint, read under its lock,
still ends where the read-ahead began and its batch size is the same. Each test here checks that
every row arrives once, and that the read-ahead was (or was not) what the pass took."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import Bridge

from bridge.pipeline import read_ahead
from bridge.pipeline.loop import PassStats

QUEUE = "MQueue1"


def _drain(runner: Any, queue: str = QUEUE, **kwargs: Any) -> list[PassStats]:
    """Each pass's stats of a drain of `queue`."""
    passes: list[PassStats] = []
    runner.drain(queue, passes.append, **kwargs)
    return passes


def _delivered_once(b: Bridge, n: int) -> None:
    ids = b.message_ids("Orders")
    assert len(ids) == n and set(ids.values()) == {1}, ids.most_common(3)


def _in_read_ahead(monkeypatch: pytest.MonkeyPatch, source: Any, name: str, first: Callable[[], None]) -> None:
    """`source.<name>` runs `first()` before itself when a read-ahead's thread calls it (the
    pass's own calls, on the main thread, go on as they were)."""
    real = getattr(source, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            first()
        return real(*args, **kwargs)

    monkeypatch.setattr(source, name, wrapped)


def _reads_by(runner: Any, adbc: bool) -> str:
    """The source method a read-ahead reads by: ADBC's (the default on PostgreSQL), or SQLAlchemy's."""
    runner.read_ahead.arrow.on = adbc
    return "fetch_after_arrow" if adbc else "fetch_after"


def _sizes_each_pass(runner: Any, sizes: list[int]) -> None:
    """Back-pressure's room as a batch size a pass, in this order."""
    each = iter(sizes)
    runner.size_batch = lambda room: setattr(runner.job, "batch_size", next(each)) if room is not None else None
    runner.pressure.room = lambda: 1


def _target_columns_in_pass(runner: Any) -> list[int]:
    """The rows of each batch whose target columns a pass made itself (on the main thread)."""
    made: list[int] = []
    real = runner.target.plain_columns

    def plain_columns(cols: Any, translated: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            made.append(len(cols.keys))
        return real(cols, translated)

    runner.target.plain_columns = plain_columns
    return made


def _target_rows(b: Bridge) -> list[tuple[Any, ...]]:
    """Each transport row's headers and body (its own id is made as it is written)."""
    return sorted((r["headers"]["NServiceBus.MessageId"], r["headers"], bytes(r["body"])) for r in b.rows("Orders"))


def test_a_drain_takes_each_read_ahead_and_writes_what_it_wrote_without(make, tmp_path: Path, pg_server: str,
                                                                        pg_schema2: str) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(55))
    runner = b.runner()
    runner.lane_min_rows = 1  # the columnar lane at 10 rows, so that columns are made ahead too
    in_pass = _target_columns_in_pass(runner)
    passes = _drain(runner)
    assert [p.read for p in passes] == [10, 10, 10, 10, 10, 5]
    _delivered_once(b, 55)
    # Passes 2 to 6 read nothing themselves, and their lanes took the columns made with the rows,
    # the target's (the header texts) too: only pass 1 made its own.
    assert runner.read_ahead.taken == 5
    assert runner.read_ahead.columns_taken == 5
    assert in_pass == [10]
    assert runner.read_ahead.arrow.reads == 5  # by ADBC, as Arrow columns (bridge/pipeline/arrow_reads.py)

    # The same rows by a drain that never reads ahead: the same transport rows, byte for byte.
    (tmp_path / "off").mkdir()
    other = Bridge(tmp_path / "off", pg_server, pg_server, source_schema=pg_schema2, target_schema=pg_schema2,
                   batch_size=10)
    try:
        assert other.cli("init") == 0
        with b.source.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(sa.select(b.tables[QUEUE]).order_by("id"))]
        with other.source.begin() as conn:
            conn.execute(other.tables[QUEUE].insert(), rows)
        off = other.runner()
        off.lane_min_rows = 1
        off.read_ahead.on = False
        _drain(off)
        assert off.read_ahead.taken == 0
        assert _target_rows(other) == _target_rows(b)
    finally:
        other.dispose()


@pytest.mark.parametrize("adbc", [True, False], ids=["adbc", "sqlalchemy"])
def test_a_row_that_commits_after_the_read_ahead_is_a_late_row_read_once(make, monkeypatch: pytest.MonkeyPatch,
                                                                         adbc: bool) -> None:
    b = make(batch_size=10)
    ids = b.insert(b.ready(30))
    with b.source.connect() as conn:
        late = dict(conn.execute(sa.select(b.tables[QUEUE]).where(b.tables[QUEUE].c.id == ids[14])).one()._mapping)
    with b.source.begin() as conn:  # id 15 is not there yet: its insert commits late, below
        conn.execute(sa.delete(b.tables[QUEUE]).where(b.tables[QUEUE].c.id == late["id"]))
    runner = b.runner()
    source = runner.sources[QUEUE]
    name = _reads_by(runner, adbc)
    read = getattr(source, name)
    committed: list[int] = []

    def fetch_after(conn: Any, after: Any, *args: Any, **kwargs: Any) -> Any:
        rows = read(conn, after, *args, **kwargs)
        if threading.current_thread() is not threading.main_thread() and after == ids[9] and not committed:
            b.insert([late])  # after the read-ahead read 11..21, before the next pass takes it
            committed.append(late["id"])
        return rows

    monkeypatch.setattr(source, name, fetch_after)
    passes = _drain(runner)
    assert committed == [ids[14]]
    # Pass 2 took the read-ahead, which had not seen id 15: a gap, read by pass 3 as a late row.
    assert passes[1].read == 10 and passes[1].gaps_open == 1
    assert runner.read_ahead.taken >= 2
    _delivered_once(b, 30)
    assert sum(p.read for p in passes) == 30
    with b.target.connect() as conn:
        assert b.count("Orders") == 30


def test_a_checkpoint_another_runner_moved_is_read_again_not_taken(make) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(40))
    runner, other = b.runner(), b.runner()
    calls = []

    def before_pass() -> None:
        calls.append(1)
        if len(calls) == 2:  # between the first pass (which read ahead 11..20) and the second
            assert other.run_pass(QUEUE).read == 10  # delivers 11..20, the checkpoint goes to 20

    passes = _drain(runner, before_pass=before_pass)
    # The second pass's checkpoint ended at 20, not at 10 where its read-ahead began: it read 21..30 itself.
    assert [p.read for p in passes] == [10, 10, 10, 0]
    assert all(p.already == 0 for p in passes)  # no row read twice, none the ledger had to catch
    assert runner.read_ahead.taken == 2  # the third pass's, begun by the second, and the fourth's
    _delivered_once(b, 40)


def test_a_batch_size_changed_between_passes_is_read_again(make) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(25))
    runner = b.runner()
    _sizes_each_pass(runner, [10, 5, 5, 5, 5, 5])
    passes = _drain(runner)
    assert [p.read for p in passes][:2] == [10, 5]
    assert runner.read_ahead.taken == len(passes) - 2  # the second pass's was for 10 rows: not taken
    _delivered_once(b, 25)


@pytest.mark.parametrize("adbc", [True, False], ids=["adbc", "sqlalchemy"])
def test_a_read_ahead_that_fails_leaves_the_pass_to_read(make, monkeypatch: pytest.MonkeyPatch, adbc: bool) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(35))
    runner = b.runner()

    def reset() -> None:
        raise sa.exc.OperationalError("SELECT", {}, Exception("connection reset"))

    _in_read_ahead(monkeypatch, runner.sources[QUEUE], _reads_by(runner, adbc), reset)
    passes = _drain(runner)
    assert [p.read for p in passes] == [10, 10, 10, 5]
    assert runner.read_ahead.taken == 0
    _delivered_once(b, 35)


def test_columns_the_read_ahead_could_not_make_are_made_by_the_lane(make, monkeypatch: pytest.MonkeyPatch) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(30))
    runner = b.runner()
    runner.lane_min_rows = 1
    source = runner.sources[QUEUE]
    made = source.plain_columns
    lanes: list[int] = []

    def plain_columns(rows: Any, take: Any, mids: Any) -> Any:
        lanes.append(len(take))
        return made(rows, take, mids)

    def misjudged() -> None:
        raise ValueError("a misjudged row")

    monkeypatch.setattr(source, "plain_columns", plain_columns)
    _in_read_ahead(monkeypatch, source, "plain_columns", misjudged)  # before the lane's own, which records
    _drain(runner)
    assert runner.read_ahead.taken == 3 and runner.read_ahead.columns_taken == 0
    assert lanes == [10, 10, 10]  # the lane made every batch's columns itself
    _delivered_once(b, 30)


def test_move_mode_never_reads_ahead(make) -> None:
    b = make(batch_size=10, mode="move")
    b.insert(b.ready(30))
    runner = b.runner()
    _drain(runner)
    assert runner.read_ahead.taken == 0
    _delivered_once(b, 30)


def test_a_drain_on_sqlite_never_reads_ahead(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", batch_size=10)
    assert b.cli("init") == 0
    b.insert(b.ready(30))
    runner = b.runner()
    assert not runner.read_ahead.on
    _drain(runner)
    assert runner.read_ahead.taken == 0
    _delivered_once(b, 30)


def test_a_drain_of_a_mariadb_queue_reads_ahead(mariadb_database: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, mariadb_database, f"sqlite:///{tmp_path}/nsb.db", batch_size=10)
    try:
        assert b.cli("init") == 0
        b.insert(b.ready(45))
        runner = b.runner()
        runner.lane_min_rows = 1
        passes = _drain(runner)
        assert [p.read for p in passes] == [10, 10, 10, 10, 5]
        assert runner.read_ahead.taken == 4 and runner.read_ahead.columns_taken == 4
        _delivered_once(b, 45)
    finally:
        b.dispose()


def test_a_drain_leaves_no_read_ahead_behind(make) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(30))
    runner = b.runner()
    passes: list[PassStats] = []
    started = runner.read_ahead.start
    begun: list[int] = []
    runner.read_ahead.start = lambda *a, **k: (begun.append(1), started(*a, **k))  # type: ignore[method-assign]
    runner.drain(QUEUE, passes.append, should_stop=lambda: bool(passes))  # stops after its first pass
    assert len(passes) == 1 and begun == [1]
    assert runner.read_ahead._ahead == {} and not runner.read_ahead.draining
    assert not [t for t in threading.enumerate() if t.name.startswith("qbridge-read-ahead")]


# A helper review's findings (session 14): a read-ahead whose thread cannot start, or that is stuck,
# never holds a drain up, nor do the columns of one no pass takes.

def test_a_read_ahead_whose_thread_cannot_start_leaves_the_pass_to_read(make, monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(30))
    runner = b.runner()

    class NoThread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(read_ahead, "threading", types.SimpleNamespace(Thread=NoThread, Event=threading.Event))
    done: list[list[PassStats]] = []
    drain = threading.Thread(target=lambda: done.append(_drain(runner)), daemon=True)
    drain.start()
    drain.join(30)
    assert not drain.is_alive(), "the drain waits for a read-ahead whose thread never started"
    assert [p.read for p in done[0]] == [10, 10, 10, 0] and runner.read_ahead.taken == 0
    assert "no read-ahead (can't start new thread)" in caplog.text
    _delivered_once(b, 30)


@pytest.mark.parametrize("adbc", [True, False], ids=["adbc", "sqlalchemy"])
def test_a_stuck_read_ahead_is_left_behind_and_the_pass_reads(make, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture, adbc: bool) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(25))
    runner = b.runner()
    monkeypatch.setattr(read_ahead, "STUCK_SECONDS", 0.3)
    # A legacy connection that does not answer, for longer than a pass waits.
    _in_read_ahead(monkeypatch, runner.sources[QUEUE], _reads_by(runner, adbc), lambda: time.sleep(1.5))
    passes = _drain(runner)
    assert [p.read for p in passes] == [10, 10, 5] and runner.read_ahead.taken == 0
    assert "a read-ahead has not ended in 0 s" in caplog.text
    _delivered_once(b, 25)


def test_a_read_ahead_no_pass_takes_holds_no_pass_up_with_its_columns(make, monkeypatch: pytest.MonkeyPatch) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(60))
    runner = b.runner()
    runner.lane_min_rows = 1
    # Columns made ahead, slowly: a pass that waited for them would take 2 s.
    _in_read_ahead(monkeypatch, runner.sources[QUEUE], "plain_columns", lambda: time.sleep(2))
    _sizes_each_pass(runner, [10, 9] * 5)  # a size changing each pass: no read-ahead fits the next pass
    began = time.monotonic()
    passes = _drain(runner)
    assert time.monotonic() - began < len(passes), "passes waited for columns nobody takes (2 s each)"
    assert runner.read_ahead.taken == 0 and runner.read_ahead.columns_taken == 0
    _delivered_once(b, 60)


def test_with_rules_a_pass_makes_its_target_columns_itself(make) -> None:
    """A [[ttbr]] rule's expiry counts from when the envelope is made: with rules, the read-ahead
    makes the source's columns only, and each pass the target's, at its own time."""
    from helpers import MAPPING

    b = make(batch_size=10, mapping=MAPPING + "\n[[routes.rules]]\nwhen = 'headers.Tenant == \"zz\"'\nto = 'Billing'\n")
    b.insert(b.ready(35))
    runner = b.runner()
    runner.lane_min_rows = 1
    in_pass = _target_columns_in_pass(runner)
    passes = _drain(runner)
    assert [p.read for p in passes] == [10, 10, 10, 5]
    assert runner.read_ahead.columns_taken == 3
    assert in_pass == [10, 10, 10, 5]
    _delivered_once(b, 35)
