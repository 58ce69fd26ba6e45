"""Review of cbb2a8a/ff70d72 (an OpenJMS drain refills its reserve by the database in age order
after the reserve's last key: Passes._refill, OpenJMSSource.aged_after/by_age/age_sort, walked_to).

Findings failed on cbb2a8a and pass since the fix (a walk from the first key after REFILLS_A_WALK
refills); guards (test_guard_*) pass: interleavings probed and found handled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.pipeline import passes
from tests.pipeline.test_scan_reserve import BASE, QUEUE, N, delivered_order, fill, once, watched
from tests.systems.test_openjms_source import Jms, make_jms

# == findings =====================================================================================

def test_finding_a_handle_older_than_the_reserve_starves_while_the_backlog_is_fed(pgjms: Jms) -> None:
    """A late-committed handle older than the reserve waits as long as inflow keeps the backlog up."""
    fill(pgjms)
    runner = pgjms.runner()
    seen = watched(runner, QUEUE)
    young = iter(range(1000))

    def inflow(stats: Any) -> None:
        if len(seen["batches"]) == 1:  # committed late with an old acceptedTime (or given back by a rollback)
            pgjms.queue_message("ID:late", accepted=BASE - 5000)
        for _ in range(3):  # producers keep pace with the drain: a backlog stays, as in a busy `qbridge run`
            i = next(young)
            pgjms.queue_message(f"ID:y-{i:03d}", accepted=BASE + 1_000_000 + i)

    runner.drain(QUEUE, on_pass=inflow, should_stop=lambda: len(seen["batches"]) >= 30)
    order = delivered_order(seen)
    # Before cbb2a8a the walk after the first reserve (pass 4) found it first; at cbb2a8a only
    # the drain's last walk could, which inflow put off for ever; fixed: a walk from the first
    # key after REFILLS_A_WALK refills (pass 16 here).
    assert "ID:late#100" in order, f"30 passes, {len(order)} handles delivered, walks {seen['walks']}: the oldest is not among them"


def test_finding_handles_a_move_mode_rollback_gives_back_starve_while_the_backlog_is_fed(pgjms_move: Jms) -> None:
    """`qbridge rollback` gives back the first batch (older than the reserve): with inflow, no pass redelivers it."""
    j = pgjms_move
    fill(j)
    runner = j.runner()
    seen = watched(runner, QUEUE)
    young = iter(range(1000))

    def inflow(stats: Any) -> None:
        if len(seen["batches"]) == 1:
            assert j.cli("rollback", "--yes", "--job", "job1") == 0  # ID:m-29..27 given back
        for _ in range(3):
            i = next(young)
            j.queue_message(f"ID:y-{i:03d}", accepted=BASE + 1_000_000 + i)

    runner.drain(QUEUE, on_pass=inflow, should_stop=lambda: len(seen["batches"]) >= 30)
    again = delivered_order(seen)[3:]
    assert "ID:m-29#100" in again, f"29 passes after the rollback, walks {seen['walks']}: the given-back handles wait"


# == guards =======================================================================================

def put(j: Jms, mid: str, accepted: int | None, seq: int | None, dest: int = 1, consumers: tuple[int, ...] = (100,)) -> None:
    """A message and its handles with these times (None: NULL), as OpenJMS stores them."""
    from bridge.demo.samples import openjms_message
    from tests.systems.test_openjms_source import blob

    def write(c: Any, t: Any) -> None:
        openjms_message(c, t, mid, dest, blob("text_simple.bin"), list(consumers), accepted=accepted or 0)
        h = t["message_handles"]
        c.execute(h.update().where(h.c.messageid == mid).values(acceptedtime=accepted, sequencenumber=seq))

    j.store(write)


@pytest.mark.parametrize("seed", [1, 2])
def test_guard_ties_and_null_times_each_once_in_age_then_keyset_order(anyjms: Jms, seed: int) -> None:
    """Many equal (acceptedTime, sequenceNumber) and NULL times around every reserve boundary:
    each handle once, in (age, consumer, message id) order, two walks and refills between."""
    import random

    rnd = random.Random(seed)
    n = 41
    ages = {}
    for i in rnd.sample(range(n), n):  # inserted in no order
        a = None if rnd.random() < 0.15 else BASE + rnd.randrange(4)
        s = None if rnd.random() < 0.2 else rnd.randrange(2)
        ages[f"ID:r-{i:03d}"] = (a if a is not None else -1, s if s is not None else -1)
        put(anyjms, f"ID:r-{i:03d}", a, s)
    runner = anyjms.runner()
    seen = watched(runner, QUEUE)
    assert runner.drain(QUEUE).delivered == n
    assert delivered_order(seen) == [f"{m}#100" for m in sorted(ages, key=lambda m: (ages[m], m))]
    assert seen["walks"] == 2 and seen["refills"] >= 4
    once(anyjms, n)


def test_guard_mariadb_case_equal_message_ids_at_the_reserve_boundary(
        request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MariaDB's case-insensitive messageId: the reserve's last key and an equal-collating id of the
    same age (`>` says neither is after the other): the refill skips it, the last walk delivers it once."""
    monkeypatch.setattr(passes, "SCAN_RESERVE", 9)
    for j in make_jms("mariadb", request, tmp_path, pg_server, pg_schema, batch_size=3, queues=[QUEUE]):
        for i in range(8):
            put(j, f"ID:c-{i:02d}", BASE + i, 0)
        put(j, "ID:c-08", BASE + 8, 0)
        put(j, "ID:C-08", BASE + 8, 0)  # the same age: only the keyset's order tells them apart
        for i in range(9, 20):
            put(j, f"ID:c-{i:02d}", BASE + i, 0)
        runner = j.runner()
        seen = watched(runner, QUEUE)
        assert runner.drain(QUEUE).delivered == 21
        order = delivered_order(seen)
        assert len(order) == len(set(order)) == 21 and seen["walks"] == 2
        once(j, 21)  # (ID:C-08 comes last, after eleven younger handles: the drain's last walk finds it)


def test_guard_a_batch_larger_than_the_reserve_refills_at_once_under_back_pressure(
        pgjms: Jms, monkeypatch: pytest.MonkeyPatch) -> None:
    """batch_size 12 over a reserve of 9: the walk keeps no reserve but a place, the next pass
    refills; back-pressure cuts passes to 1..12 rows; every handle once, oldest first."""
    fill(pgjms, 40)
    runner = pgjms.runner()
    runner.rated = runner.rated.model_copy(update={"batch_size": 12})
    seen = watched(runner, QUEUE)
    rooms = iter([12, 1, 12, 5, 2, 12, 9, 11, 3, 12] * 10)
    monkeypatch.setattr(runner.pressure, "room", lambda: next(rooms))
    assert runner.drain(QUEUE).delivered == 40
    assert delivered_order(seen) == [f"ID:m-{i:02d}#100" for i in reversed(range(40))]
    assert seen["walks"] == 2 and seen["refills"] >= 3
    once(pgjms, 40)


def test_guard_another_process_passes_between_this_drains_refills(pgjms: Jms) -> None:
    """Another process runs a lone pass (a walk: the three oldest new) after each of this drain's
    passes: this drain's refills and reserves drop what it took; every handle once."""
    fill(pgjms)
    a, b = pgjms.runner(), pgjms.runner()
    took: list[int] = []
    total = a.drain(QUEUE, on_pass=lambda stats: took.append(b.run_pass(QUEUE).delivered))
    assert total.delivered + sum(took) == N
    once(pgjms, N)


def test_guard_copy_mode_rollback_between_refills(pgjms: Jms) -> None:
    """After the 4th pass (the first refill), a copy-mode rollback withdraws everything delivered:
    the withdrawn handles are older than the refill's place; the drain delivers each again once."""
    fill(pgjms)
    runner = pgjms.runner()
    seen = watched(runner, QUEUE)

    def rollback(stats: Any) -> None:
        if len(seen["batches"]) == 4:
            assert pgjms.cli("rollback", "--yes", "--job", "job1") == 0
            assert pgjms.ledger() == {}

    assert runner.drain(QUEUE, on_pass=rollback).delivered == N + 12
    once(pgjms, N)


def test_guard_a_refill_pass_whose_consume_fails_after_its_target_commit_move_mode(
        pgjms_move: Jms, monkeypatch: pytest.MonkeyPatch) -> None:
    """Move mode: the 4th pass (a refill) commits its target and its legacy consume is cut: the
    retried drain consumes what was left pending, walks afresh; nothing twice, every handle consumed."""
    from helpers import fails_on_call

    from bridge.retry import with_backoff

    j = pgjms_move
    fill(j)
    runner = j.runner()
    seen = watched(runner, QUEUE)
    fails_on_call(monkeypatch, runner.sources[QUEUE], "consume", 4, "DELETE")
    with_backoff(lambda: runner.drain(QUEUE), "drain", sleep=lambda s: None)
    assert seen["refills"] >= 1
    assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
    once(j, N)
