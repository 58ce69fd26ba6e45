"""A drain of a scan source whose walk goes in no age order (OpenJMS: by consumer and message id)
keeps the oldest new keys a walk found beyond its batch, and its next passes take their batches
from them: a walk each SCAN_RESERVE keys, where every pass walked every handle (a drain of n
handles read n²/2b keys: 100k handles took 79 s by `sync --once`). Each handle still once,
oldest first; a key the ledger took meanwhile dropped, one consumed meanwhile skipped, one put
behind the walk delivered by the same drain, a failed pass's drain walked again from scratch."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import fails_on_call

from bridge.pipeline import passes
from bridge.pipeline.oldest import Oldest
from bridge.pipeline.passes import Passes
from tests.systems.test_openjms_source import Jms, make_jms

QUEUE, BASE = "orders", 1_141_916_400_000
N = 30


@pytest.fixture(params=["postgres", "mariadb"])
def jms(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Jms]:
    monkeypatch.setattr(passes, "SCAN_RESERVE", 9)  # a walk keeps three batches of three
    yield from make_jms(request.param, request, tmp_path, pg_server, pg_schema, batch_size=3, queues=[QUEUE])


def key(i: int) -> str:
    return f"ID:m-{i:02d}#100"


def fill(j: Jms, n: int = N) -> None:
    """Message ids sort the other way round from their accept times: the walk is youngest first."""
    for i in range(n):
        j.queue_message(f"ID:m-{i:02d}", accepted=BASE + 1000 * (n - i))


def watched(runner: Any, queue: str = QUEUE) -> dict[str, Any]:
    """Counts the passes' walks and the keys they yield, their refills by age and the keys they
    read, and records the batch each pass took: fetched itself, or read ahead for it while the
    pass before committed (pipeline/read_ahead.py; the read-ahead's own calls are not the passes')."""
    source = runner.sources[queue]
    seen: dict[str, Any] = {"walks": 0, "keys": 0, "refills": 0, "refilled": 0, "batches": []}
    walk, fetch, by_age, take = source.iter_aged, source.fetch_keys, source.aged_after, runner.read_ahead.take

    def refilled(conn: sa.Connection, after: Any, limit: int) -> Any:
        seen["refills"] += 1
        page = by_age(conn, after, limit)
        seen["refilled"] += len(page)
        return page

    def counted(conn: sa.Connection, after: Any = None, page: int = 10_000) -> Iterator[Any]:
        by_pass = threading.current_thread() is threading.main_thread()
        seen["walks"] += by_pass
        for item in walk(conn, after, page):
            seen["keys"] += by_pass
            yield item

    def fetched(conn: sa.Connection, keys: Any, lock: bool) -> Any:
        if threading.current_thread() is threading.main_thread():
            seen["batches"].append(list(keys))
        return fetch(conn, keys, lock)

    def taken(queue: str, want: Any) -> Any:
        rows = take(queue, want)
        if rows is not None:
            seen["batches"].append(list(want))
        return rows

    source.iter_aged, source.fetch_keys, source.aged_after, runner.read_ahead.take = counted, fetched, refilled, taken
    return seen


def delivered_order(seen: dict[str, Any]) -> list[str]:
    """Every key `watched` saw fetched, batch after batch."""
    return [k for b in seen["batches"] for k in b]


def once(j: Jms, n: int) -> None:
    ids = j.message_ids("Orders")
    assert len(ids) == n and set(ids.values()) == {1}, ids
    assert j.cli("verify") == 0


def test_a_drain_walks_once_a_reserve_not_once_a_pass_and_goes_oldest_first(jms: Jms) -> None:
    fill(jms)
    runner = jms.runner()
    seen = watched(runner)
    assert runner.drain(QUEUE).delivered == N
    once(jms, N)
    # Ten passes of three and one that finds nothing new. Walks at the 1st (30 new keys: nine
    # kept) and the 11th; the database refills the reserve in age order at the 4th, 7th and
    # 10th (9, 9 and the last 3): 81 keys read, where a walk each reserve read 120 and a walk
    # each pass 300.
    assert seen["walks"] == 2 and seen["keys"] == 2 * N
    assert seen["refills"] == 3 and seen["refilled"] == N - 9
    assert [k for b in seen["batches"] for k in b] == [key(i) for i in reversed(range(N))]
    assert runner.drain(QUEUE).delivered == 0


def test_a_drain_walks_from_the_first_key_again_after_a_few_refills(jms: Jms) -> None:
    """REFILLS_A_WALK refills, then a walk from the first key (a handle older than the reserve
    waits a bounded number of reserves); still every handle once, oldest first."""
    fill(jms, 60)
    runner = jms.runner()
    seen = watched(runner)
    assert runner.drain(QUEUE).delivered == 60
    # A walk (9 kept of 60), four refills (36), a walk (9 kept of 15), a refill (the last 6),
    # and the drain's last walk.
    assert seen["walks"] == 3 and seen["refills"] == 5 and passes.REFILLS_A_WALK == 4
    assert [k for b in seen["batches"] for k in b] == [f"ID:m-{i:02d}#100" for i in reversed(range(60))]
    once(jms, 60)


def test_keys_taken_or_consumed_meanwhile_are_not_delivered_twice_or_missed(jms: Jms) -> None:
    fill(jms)
    runner = jms.runner()
    seen = watched(runner)
    other = jms.runner()

    def meanwhile(stats: Any) -> None:
        if len(seen["batches"]) != 1:
            return
        # The walk kept ids 26..21 for the next two passes: another process delivers the next
        # three oldest (26, 25, 24), and the legacy side's consumer acknowledges 23.
        assert other.run_pass(QUEUE).delivered == 3
        jms.store(lambda c, t: c.execute(t["message_handles"].delete().where(t["message_handles"].c.messageid == "ID:m-23")))

    total = runner.drain(QUEUE, on_pass=meanwhile)
    assert total.delivered == N - 4
    ids = jms.message_ids("Orders")
    assert len(ids) == N - 1 and set(ids.values()) == {1}
    assert seen["batches"][1] == [key(23), key(22), key(21)]  # the rest of the reserve, less what was taken
    assert jms.cli("verify") == 0


def test_a_key_put_behind_the_walk_comes_in_the_same_drain(jms: Jms) -> None:
    fill(jms)
    runner = jms.runner()
    seen = watched(runner)

    def add_oldest(stats: Any) -> None:
        if len(seen["batches"]) == 1:  # older than every handle: the reserve does not hold it
            jms.queue_message("ID:m-99", accepted=BASE)

    assert runner.drain(QUEUE, on_pass=add_oldest).delivered == N + 1
    # Refills go on after the reserve's last key: the drain's last walk, from the first key, finds it.
    assert seen["batches"][-1] == ["ID:m-99#100"] and seen["walks"] == 2
    once(jms, N + 1)


def test_a_failed_pass_retries_its_drain_with_a_fresh_walk(jms: Jms, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass that fails takes its batch from the reserve: the retry walks again, and neither
    that batch nor the rest of the reserve is lost or doubled."""
    fill(jms)
    runner = jms.runner()
    seen = watched(runner)
    fails_on_call(monkeypatch, Passes, "_deliver", 2)
    with pytest.raises(sa.exc.OperationalError):
        runner.drain(QUEUE)
    assert jms.ledger() == {"delivered": 3} and seen["walks"] == 1
    assert runner.drain(QUEUE).delivered == N - 3
    # The retry's own: a walk at its 1st pass (27 keys new, nine kept), refills at its 4th, 7th
    # and 10th (9, 9, none), and a walk after them, which finds no new key.
    assert seen["walks"] == 1 + 2 and seen["refills"] == 3 and seen["refilled"] == 18
    once(jms, N)


def test_a_move_mode_drain_takes_its_reserve_and_consumes_each_handle(
        request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passes, "SCAN_RESERVE", 9)
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, mode="move", batch_size=3, queues=[QUEUE]):
        fill(j)
        runner = j.runner()
        seen = watched(runner)
        assert runner.drain(QUEUE).delivered == N
        assert seen["walks"] == 2 and seen["refills"] == 3
        assert [k for b in seen["batches"] for k in b] == [key(i) for i in reversed(range(N))]
        assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
        once(j, N)


def test_a_large_backlog_is_told_once_with_what_moves_it_faster(jms: Jms, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(passes, "BACKLOG_HINT", 20)
    fill(jms)
    runner = jms.runner()
    with caplog.at_level("INFO", logger="qbridge.batch"):
        assert runner.drain(QUEUE).delivered == N
        fill_more = [f"ID:n-{i:02d}" for i in range(25)]
        for mid in fill_more:
            jms.queue_message(mid, accepted=BASE)
        assert runner.drain(QUEUE).delivered == 25
    told = [r.getMessage() for r in caplog.records if "qbridge migrate" in r.getMessage()]
    # The first walk found 30 new handles (over 20): told; the second walk's 21 and the next
    # drain's 25 are not told again by this process.
    assert told == ["job=job1 queue=orders 30 messages wait; passes have the database sort all of them once each 9 they take: "
                    "`qbridge migrate` moves a backlog this size in one walk"]


def test_refills_page_every_handle_once_in_the_order_a_walk_keeps(jms: Jms) -> None:
    """aged_after, page after page, gives every handle once, in the order `Oldest` keeps a walk's
    keys (age, then the walk's order for equal ages; NULL times first), on each server."""
    from tests.systems.test_openjms_source import QUEUE_ID

    for i in range(25):
        accepted = None if i < 3 else BASE + (25 - i) // 4  # NULL times, and ties
        jms.store(lambda c, t, i=i, a=accepted: c.execute(t["message_handles"].insert().values(
            messageid=f"ID:a-{i:02d}", destinationid=QUEUE_ID, consumerid=QUEUE_ID * 100, priority=4,
            acceptedtime=a, sequencenumber=None if i == 7 else i % 2, expirytime=0, delivered=0)))
    source = jms.runner().sources[QUEUE]
    with jms.source.connect() as conn:
        kept = Oldest(25)
        for k, age in source.iter_aged(conn):
            kept.add(age, k)
        expected = kept.keys()
        pages, after = [], None
        while page := source.aged_after(conn, after, 4):
            pages += [k for k, _ in page]
            after = page[-1][1]
            assert page[-1][1] == source.age_sort(dict(source.iter_aged(conn))[page[-1][0]], page[-1][0])
    assert pages == expected and len(set(pages)) == 25


def test_the_refill_compiles_for_sql_server() -> None:
    from sqlalchemy.dialects import mssql

    from bridge.config import JobConfig
    from bridge.sources.openjms import OpenJMSSource

    job = JobConfig.model_validate({"name": "j", "source": {"system": "openjms", "connection": "c", "queues": [QUEUE]},
                                    "target": {"connection": "n"}, "mapping": "m.toml"})
    sql = re.sub(r":\w+_\d+", "?", " ".join(str(OpenJMSSource(job, sa.create_engine("sqlite://"), QUEUE, "db").by_age(
        (5, 1, 100, "ID:x"), 20_000, "mssql").compile(dialect=mssql.dialect())).split()))
    assert sql.startswith("SELECT TOP __[POSTCOMPILE_param_1] ")  # TOP n: SQL Server's LIMIT
    assert sql.endswith("ORDER BY coalesce(message_handles.acceptedtime, -1), coalesce(message_handles.sequencenumber, -1), "
                        "message_handles.consumerid, message_handles.messageid")
    assert "AND (coalesce(message_handles.acceptedtime, -1) > ? OR " in sql  # spelled out: no row values
