"""Review of b0f01f9 (an OpenJMS drain walks from the first key again after REFILLS_A_WALK refills:
Passes._scan's `refills` counter, popped by a walk and in drain()'s finally).

No finding: the paths probed (inflow, late handle at every offset of the walk/refill cycle,
back-pressure changing the batch each pass, a stopped drain, a failed pass retried by
with_backoff, PostgreSQL and MariaDB) kept the bound and delivered each handle once. The tests
below are guards: they pass."""

from __future__ import annotations

import random
from typing import Any

import pytest
from helpers import fails_on_call

from bridge.pipeline.stats import REFILLS_A_WALK
from bridge.retry import with_backoff
from tests.pipeline.test_scan_reserve import BASE, QUEUE, fill, once, watched
from tests.systems.test_openjms_source import Jms


class Kinds:
    """Each committed pass as W (a walk from the first key), F (a refill) or R (from the reserve)."""

    def __init__(self, seen: dict[str, Any]) -> None:
        self.seen, self.log, self.w, self.r = seen, [], 0, 0

    def note(self) -> None:
        w, r = self.seen["walks"], self.seen["refills"]
        self.log.append("W" if w > self.w else "F" if r > self.r else "R")
        self.w, self.r = w, r

    def __str__(self) -> str:
        return "".join(self.log)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_guard_a_late_handle_waits_at_most_refills_a_walk_refills_under_inflow_and_back_pressure(
        anyjms: Jms, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Back-pressure cuts each pass to 1..3 rows, producers add 0..4 young handles a pass, and a
    handle older than everything commits late at a random pass: no more than REFILLS_A_WALK refills
    run between its commit and its delivery (the walk after them delivers it); every handle once."""
    rnd = random.Random(seed)
    fill(anyjms)
    runner = anyjms.runner()
    seen = watched(runner, QUEUE)
    kinds = Kinds(seen)
    rooms = iter([rnd.choice([1, 2, 3]) for _ in range(1000)])
    monkeypatch.setattr(runner.pressure, "room", lambda: next(rooms))
    young = iter(range(1000))
    k = rnd.randrange(1, 20)
    at: dict[str, int] = {}

    def inflow(stats: Any) -> None:
        kinds.note()
        n = len(seen["batches"])
        if n == k:
            anyjms.queue_message("ID:late", accepted=BASE - 5000)
        if "ID:late#100" in seen["batches"][-1]:
            at.setdefault("late", n)
        for _ in range(rnd.choice([0, 1, 2, 3, 4])):
            i = next(young)
            anyjms.queue_message(f"ID:y-{i:03d}", accepted=BASE + 1_000_000 + i)

    runner.drain(QUEUE, on_pass=inflow, should_stop=lambda: len(seen["batches"]) >= 120)
    assert QUEUE not in runner.refills
    assert "late" in at, f"passes {kinds}: the late handle (committed after pass {k}) was not delivered"
    between = str(kinds)[k:at["late"]]
    assert between.count("F") <= REFILLS_A_WALK and between.endswith("W"), (k, at, str(kinds))
    runner.drain(QUEUE)
    order = [x for b in seen["batches"] for x in b]
    assert len(order) == len(set(order))
    once(anyjms, len(order))


def test_guard_the_count_is_not_carried_into_the_next_drain_stopped_or_failed(
        pgjms: Jms, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain stopped after its 2nd refill, then one whose 3rd refill fails (a cut connection)
    and which with_backoff retries: each drain leaves no count; the retried drain starts with a
    walk and walks again after REFILLS_A_WALK refills of its own, not fewer; every handle once."""
    fill(pgjms, 120)
    runner = pgjms.runner()
    seen = watched(runner, QUEUE)
    kinds = Kinds(seen)
    runner.drain(QUEUE, on_pass=lambda s: kinds.note(), should_stop=lambda: seen["refills"] >= 2)
    assert str(kinds) == "WRRFRRF" and QUEUE not in runner.refills
    fails_on_call(monkeypatch, runner.sources[QUEUE], "aged_after", 3, "SELECT")
    kinds.log.clear()
    total = with_backoff(lambda: runner.drain(QUEUE, on_pass=lambda s: kinds.note()), "drain", sleep=lambda s: None)
    assert QUEUE not in runner.refills
    # The first attempt: a walk, two refills, and its third failed; the retry: a walk, four
    # refills, a walk, and so on to the drain's last walk.
    retry = str(kinds)[len("WRRFRRFRR"):]
    assert retry.startswith("WRRFRRFRRFRRFRRW"), str(kinds)
    assert total.delivered == 120 - 21 - 27  # the retry's own (21, then 27 delivered before it)
    once(pgjms, 120)
