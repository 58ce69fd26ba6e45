"""Review of da222ef (an OpenJMS drain takes its batches from a reserve its walks keep: Passes._scan,
_from_reserve, Passes._drain, Oldest's `younger` threshold).

The finding's test fails while it stands; the others are guards of interleavings probed and
found handled (each handle delivered once, oldest first where the old code was, nothing left
behind that the old drain would have delivered)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from helpers import fails_on_call

from bridge.demo.samples import openjms_message
from bridge.ledger import giveback
from bridge.ledger.state import LedgerEntry, Quarantined
from bridge.model import message_ids
from bridge.pipeline import passes
from bridge.pipeline.oldest import Oldest
from bridge.retry import with_backoff
from tests.pipeline.test_scan_reserve import BASE, QUEUE, N, delivered_order, fill, key, once, watched
from tests.systems.test_openjms_source import SUBSCRIBERS, TOPIC_ID, Jms, blob, make_jms

TOPIC = "prices.eu"





# == finding ======================================================================================

def test_finding_run_pass_after_a_stopped_drain_keeps_taking_a_stale_reserve(pgjms: Jms) -> None:
    """Fixed: `drain` drops its queue's reserve as it returns, however it returns.

    A drain that stops with a reserve held (should_stop: `qbridge run`'s SIGTERM or reloaded
    config; may_go: paused or held; a failed pass) leaves `reserves[queue]` set. `run_pass` called
    on its own (a public method: tests, tools, any later caller that is not `_drain`) then takes
    its batch from that reserve, but nothing moves `reserve_ends` back into `reserves`: every
    such pass starts again at the same stale reserve, drops what the ledger has, and once the
    whole reserve is in the ledger returns an empty batch with `more` False, for ever, while 21
    handles wait. Before da222ef a lone pass walked every handle and delivered the three oldest.

    Fix: take from (and adopt into) the reserve only inside a drain, e.g. `_drain` passes
    `from_reserve=True` to `run_pass` (or sets a per-queue flag it clears in a finally), and a
    pass outside a drain pops `reserves[queue]` and walks; or let `run_pass` itself adopt
    `reserve_ends` after its commit, so a lone pass at least advances it."""
    fill(pgjms)
    runner = pgjms.runner()
    passes_done = {"n": 0}

    def count(stats: Any) -> None:
        passes_done["n"] += 1

    runner.drain(QUEUE, on_pass=count, should_stop=lambda: passes_done["n"] >= 1)
    assert pgjms.ledger() == {"delivered": 3}
    assert QUEUE not in runner.reserves  # a reserve serves its own drain's passes only (the fix)

    # The caller's loop: passes while the last one says there is more.
    for _ in range(2 * N):
        if not runner.run_pass(QUEUE).more:
            break
    assert pgjms.ledger()["delivered"] == N, "a pass said nothing more was waiting while handles were"
    assert runner.run_pass(QUEUE).delivered == 0


# == guards =======================================================================================

@pytest.mark.parametrize("seed", range(40))
def test_guard_oldest_keeps_what_a_stable_sort_keeps(seed: int) -> None:
    """The `younger` threshold keeps exactly what the old cut kept: the `size` smallest by (age,
    order added), ties going to the key added first; `more` and `full()` say more than `size`
    were added. With ages in order (BizTalk's walk) and in none (OpenJMS's), with many ties."""
    rnd = random.Random(seed)
    size = rnd.choice([1, 2, 3, 5, 8])
    n = rnd.choice([0, 1, size, size + 1, 2 * size, 2 * size + 1, 7 * size + 3])
    in_order = seed % 4 == 0
    ages = sorted(rnd.randrange(6) for _ in range(n)) if in_order else [(rnd.randrange(4), rnd.randrange(2)) for _ in range(n)]
    o = Oldest(size)
    fulls = []
    for i, age in enumerate(ages):
        o.add(age, i)
        fulls.append(o.full())
    expected = [i for _, i in sorted(zip(ages, range(n)), key=lambda p: p[0])][:size]
    assert o.keys() == expected
    assert o.more == (n > size) and o.full() == (n > size)
    assert fulls == [i + 1 > size for i in range(n)]


def test_guard_a_failure_after_the_target_commit_of_a_reserve_pass_move_mode(pgjms_move: Jms,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Move mode: the second pass (from the reserve) commits its target, then its legacy consume
    fails (a cut connection): the retried drain consumes what was left pending, walks afresh and
    delivers the rest; nothing twice, every handle consumed."""
    j = pgjms_move
    fill(j)
    runner = j.runner()
    fails_on_call(monkeypatch, runner.sources[QUEUE], "consume", 2, "DELETE")
    total = with_backoff(lambda: runner.drain(QUEUE), "drain", sleep=lambda s: None)
    assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
    assert total.delivered == N - 6  # the retry's own: the first attempt delivered two batches
    once(j, N)


def test_guard_back_pressure_changing_the_batch_between_passes(pgjms: Jms, monkeypatch: pytest.MonkeyPatch) -> None:
    """size_batch cuts each pass to a different room (1, 2, 3, ...): the passes from the reserve
    take that many, oldest first; every handle once, in age order."""
    fill(pgjms)
    runner = pgjms.runner()
    seen = watched(runner, QUEUE)
    rooms = iter([1, 2, 3, 1, 1, 2, 3, 3, 2, 1] * 10)
    monkeypatch.setattr(runner.pressure, "room", lambda: next(rooms))
    assert runner.drain(QUEUE).delivered == N
    assert delivered_order(seen) == [key(i) for i in reversed(range(N))]
    once(pgjms, N)


def test_guard_a_drain_stopped_or_paused_with_a_reserve_held_then_a_new_drain(pgjms: Jms) -> None:
    """should_stop after the first pass, then a pause (may_go): the next drains drop the reserve
    they find and walk first; every handle once, and the reserve's keys are not skipped."""
    fill(pgjms)
    runner = pgjms.runner()
    seen = watched(runner, QUEUE)
    runner.drain(QUEUE, should_stop=lambda: len(seen["batches"]) >= 1)
    assert QUEUE not in runner.reserves and QUEUE not in runner.walked_to and seen["walks"] == 1
    assert pgjms.cli("pause", "--job", "job1", "--why", "review") == 0
    assert runner.drain(QUEUE).waiting is not None and seen["walks"] == 1
    assert pgjms.cli("resume", "--job", "job1") == 0
    pgjms.queue_message("ID:m-98", accepted=BASE)  # older than every handle: the new walk finds it first
    assert runner.drain(QUEUE).delivered == N - 3 + 1
    # The new drain walked at its first pass, not from the old reserve, refilled three times
    # and walked at its end.
    assert seen["walks"] == 1 + 2 and seen["refills"] == 3
    assert seen["batches"][1][0] == "ID:m-98#100"
    once(pgjms, N + 1)


def test_guard_another_process_drains_everything_while_a_reserve_is_held(pgjms: Jms) -> None:
    """Two processes on the job (`sync --once` beside `run`, or one that lost the lock): B drains
    the whole queue after A's first pass. A's next pass finds every reserved key in the ledger,
    delivers nothing, refills from after the reserve and finds nothing new, walks once more,
    finds nothing and ends; nothing twice."""
    fill(pgjms)
    a, b = pgjms.runner(), pgjms.runner()
    seen = watched(a, QUEUE)

    def other(stats: Any) -> None:
        if len(seen["batches"]) == 1:
            assert b.drain(QUEUE).delivered == N - 3

    total = a.drain(QUEUE, on_pass=other)
    assert total.delivered == 3 and seen["batches"][1:] == [[], [], []]
    once(pgjms, N)


def test_guard_reserved_keys_the_ledger_took_as_quarantined_or_skipped_are_dropped(pgjms: Jms) -> None:
    """Another process quarantined one reserved key and skipped another (recorded as a pass
    records them): the reserve's passes deliver neither, and keep the rest in order."""
    fill(pgjms)
    runner = pgjms.runner()
    seen = watched(runner, QUEUE)
    q, s = key(25), key(22)

    def meanwhile(stats: Any) -> None:
        if len(seen["batches"]) != 1:
            return
        other = pgjms.runner()
        origin = other.origins[QUEUE]
        mq, ms = message_ids("openjms", other.database, QUEUE, [q, s])
        with other.target_engine.begin() as tconn:
            other.state.lock_checkpoint(tconn, other.job.name, QUEUE)
            other.state.record(tconn, other.job.name, QUEUE, origin,
                               [LedgerEntry(mq, q, "quarantined", None, "bad row"), LedgerEntry(ms, s, "skipped", None, None)],
                               [Quarantined(mq, q, "bad row", {"key": q})])

    assert runner.drain(QUEUE, on_pass=meanwhile).delivered == N - 2
    assert seen["batches"][1] == [key(26), key(24), key(23)]
    assert q not in delivered_order(seen) and s not in delivered_order(seen)
    assert pgjms.ledger() == {"delivered": N - 2, "quarantined": 1, "skipped": 1}
    assert len(pgjms.message_ids("Orders")) == N - 2


def test_guard_topic_siblings_split_between_batch_and_reserve_move_mode(
        request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic with two durable subscribers: sibling handles share their age, so a batch of
    three cuts a message's pair in two, one in the batch and one in the reserve. Move mode: each
    subscriber's copy once, the message row kept until its last handle is consumed; and the
    legacy subscriber consuming a reserved sibling meanwhile is not delivered by qbridge."""
    monkeypatch.setattr(passes, "SCAN_RESERVE", 5)
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, mode="move", batch_size=3, queues=[TOPIC]):
        n = 8
        for i in range(n):
            j.store(lambda c, t, i=i: openjms_message(c, t, f"ID:t-{i:02d}", TOPIC_ID, blob("text_simple.bin"),
                                                      list(SUBSCRIBERS.values()), accepted=BASE + 1000 * (n - i)))
        runner = j.runner()
        seen = watched(runner, TOPIC)
        audit = SUBSCRIBERS["audit-sub"]

        def legacy_consumes(stats: Any) -> None:
            if len(seen["batches"]) == 1:  # the audit subscriber takes ID:t-05 itself, as OpenJMS does
                j.store(lambda c, t: c.execute(t["message_handles"].delete().where(
                    t["message_handles"].c.messageid == "ID:t-05", t["message_handles"].c.consumerid == audit)))

        assert runner.drain(TOPIC, on_pass=legacy_consumes).delivered == 2 * n - 1
        assert seen["batches"][0][2].startswith("ID:t-06#") and seen["batches"][1][0].startswith("ID:t-06#")
        assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
        billing, trail = j.message_ids("Billing"), j.message_ids("AuditTrail")
        assert len(billing) == n and len(trail) == n - 1 and set(billing.values()) | set(trail.values()) == {1}
        assert j.cli("verify") == 0  # the handle the legacy subscriber took is no longer counted


def test_guard_a_move_mode_rollback_while_a_reserve_is_held(pgjms_move: Jms) -> None:
    """After the first pass, `qbridge rollback` withdraws its three messages and gives their
    handles back: the drain goes on from its reserve and its last walk delivers the given-back
    handles again, once each (the refills go on after the reserve's last key, in age order,
    and the given-back handles are older); every handle consumed."""
    j = pgjms_move
    fill(j)
    runner = j.runner()
    seen = watched(runner, QUEUE)

    def rollback(stats: Any) -> None:
        if len(seen["batches"]) == 1:
            assert j.cli("rollback", "--yes", "--job", "job1") == 0
            assert j.count_rows("message_handles") == N  # given back

    total = runner.drain(QUEUE, on_pass=rollback)
    assert total.delivered == N + 3
    # the drain's last walk takes the given-back handles (aged by their JMSTimestamp)
    assert sorted(seen["batches"][-1]) == sorted([key(29), key(28), key(27)])
    assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
    once(j, N)


def test_guard_a_rollback_that_still_owes_rows_retries_the_drain_with_a_fresh_walk(
        pgjms_move: Jms, monkeypatch: pytest.MonkeyPatch) -> None:
    """A move-mode rollback withdrew the first batch but was cut off before giving the handles
    back: the drain's next pass (from the reserve) raises LedgerConflict under its lock; the
    retried drain drops the reserve, gives the rows back first and delivers everything once."""
    j = pgjms_move
    fill(j)
    runner = j.runner()
    seen = watched(runner, QUEUE)

    def cut_rollback(stats: Any) -> None:
        if len(seen["batches"]) == 1:
            with monkeypatch.context() as m:
                m.setattr(giveback, "finish", lambda *a, **k: (0, 0))
                assert j.cli("rollback", "--yes", "--job", "job1") == 0
            assert j.count_rows("message_handles") == N - 3  # still owed

    total = with_backoff(lambda: runner.drain(QUEUE, on_pass=cut_rollback), "drain", sleep=lambda s: None)
    assert total.delivered == N  # the retry's: the 27 never delivered and the 3 given back
    assert len(seen["batches"]) > 1 and sorted(seen["batches"][1]) == sorted([key(29), key(28), key(27)])
    assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
    once(j, N)
