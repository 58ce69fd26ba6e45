"""A copy-mode pass of a range-ledger queue asks the ledger only which of its keys are there,
and a range ledger's bits say it alone (State.known's `bits_only`): every recorded key has its
bit, a quarantined one an entry too. So the pass makes no per-message lookup, and a message the
bits hold is never delivered again, a replayed one included (its entry says delivered, its bit
still quarantined). Move mode still reads the entries: whether a row was quarantined decides
whether it consumes it."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from bridge.demo.samples import nginn_row
from bridge.ledger import ledger_lookup

QUEUE = "MQueue1"


def _lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The keys of each per-message ledger lookup made from here on."""
    made: list[int] = []
    real = ledger_lookup.entries

    def entries(conn: Any, ledger: Any, origin: int, keys: Any) -> dict[str, str]:
        made.append(len(keys))
        return real(conn, ledger, origin, keys)

    monkeypatch.setattr(ledger_lookup, "entries", entries)
    return made


def _replayed_once(b: Any) -> list[int]:
    """20 rows delivered, the 5th quarantined, then mended and replayed: 20 in Orders."""
    from bridge.lifecycle.quarantine import QuarantineDesk

    now = b.now_local()
    ids = b.insert([nginn_row(QUEUE, i, now, headers="Filter=a=b" if i == 5 else "") for i in range(1, 21)])
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 19
    runner = b.runner()
    with runner.target_engine.begin() as conn:
        [q] = runner.state.quarantined(conn, "job1")
        conn.execute(sa.update(runner.state.quarantine).values(
            raw=sa.func.replace(runner.state.quarantine.c.raw, "Filter=a=b", "Filter=a")))
    QuarantineDesk(b.runner(), "ops", None).replay([q["message_id"]])
    assert b.count("Orders") == 20
    return ids


def _rewound(b: Any) -> None:
    """The queue's checkpoint as before its first pass: the next pass reads every row again."""
    runner = b.runner()
    c = runner.state.checkpoint
    with runner.target_engine.begin() as conn:
        conn.execute(sa.update(c).where(c.c.queue == QUEUE).values(high=None, gaps="[]"))


def test_a_copy_pass_reading_recorded_keys_again_finds_them_by_their_bits_alone(make, monkeypatch) -> None:
    b = make(batch_size=10)
    _replayed_once(b)
    _rewound(b)
    made = _lookups(monkeypatch)
    runner = b.runner()
    passes: list[Any] = []
    runner.drain(QUEUE, passes.append)
    assert sum(p.delivered for p in passes) == 0 and sum(p.already for p in passes) == 20
    assert made == []  # no per-message lookup: the bits said it
    assert b.count("Orders") == 20 and b.ledger() == {"delivered": 20}
    assert b.cli("verify") == 0


def test_move_mode_still_reads_the_entries(make, monkeypatch) -> None:
    b = make(batch_size=10, mode="move")
    b.insert(b.ready(10))
    made = _lookups(monkeypatch)
    runner = b.runner()
    runner.drain(QUEUE, lambda stats: None)
    assert made and sum(made) == 10
    assert b.count("Orders") == 10
