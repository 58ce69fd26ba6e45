"""A pass reading a range-ledger queue's recorded keys again (a rewound checkpoint: what a
rollback's lowered checkpoint, a renamed job or a second job on the queue read) finds them all
there, a replayed message included (its entry says delivered, its bit still quarantined), and
delivers nothing twice. Passes read the per-message entries as well as the bits, in copy mode
too: a bits-only lookup (tried in session 16, ~1% at batch 2,000) trusts every entry to have its
bit, which an earlier qbridge's cut-off fold broke (tests/review/test_fold_order_review.py)."""

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


@pytest.mark.parametrize("mode", ["copy", "move"])
def test_a_pass_reading_recorded_keys_again_finds_them_and_delivers_nothing_twice(make, monkeypatch, mode: str) -> None:
    b = make(batch_size=10)
    _replayed_once(b)
    _rewound(b)
    if mode == "move":
        b.mode = "move"
        b.write_config()
    made = _lookups(monkeypatch)
    runner = b.runner()
    passes: list[Any] = []
    runner.drain(QUEUE, passes.append)
    assert sum(p.delivered for p in passes) == 0 and sum(p.already for p in passes) == 20
    assert sum(made) == 20  # the entries read too, in both modes
    assert b.count("Orders") == 20 and b.ledger() == {"delivered": 20}
    assert b.cli("verify") == 0
