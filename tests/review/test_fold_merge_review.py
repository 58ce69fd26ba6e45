"""Review of 69ac8a7 (init merges a cut-off fresh fold's qbridge_ledger_ranges_new into a range
ledger made in place since, and every command refuses such a ledger; init reads every quarantined
entry for one without its bit; State.known reads the entries again).

Each test says FAILS (a finding) or PASSES (a guard: checked and found sound)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from helpers import BY_TYPE, FIXED, Killed, each_once_after_a_re_read_and_replay, entries_without_bits, init_killed_at_mark
from review.test_fold_order_review import QUEUE, _earlier_ledger, _folded_the_earlier_way_and_cut_off

from bridge.ledger import ranges_upgrade
from bridge.ledger.ranges import Ranges


def _fresh_fold_cut_off_then_dba_ranges(b: Any, monkeypatch: Any) -> None:
    """A fresh fold (no range ledger) killed in its third transaction: the quarantined bit and the
    first chunk's bits (keys 1, 2) in qbridge_ledger_ranges_new, their entries deleted; then a DBA
    creates qbridge_ledger_ranges from `init --print-sql`'s DDL."""
    init_killed_at_mark(b, monkeypatch)
    b.runner().state.ranges.table.create(b.target)


def _has(b: Any, name: str) -> bool:
    with b.runner().target_engine.connect() as conn:
        return sa.inspect(conn).has_table(name, schema=b.runner().state.ranges.table.schema)


def test_guard_a_crash_after_the_merge_and_drop_before_commit_keeps_the_new_table(on_each_db, monkeypatch) -> None:
    """PASSES (guard, PostgreSQL and SQLite). init killed after the merge and the DROP, before its
    first transaction commits: qbridge_ledger_ranges_new is still there (DDL rolled back), commands
    still refuse, and the next init merges it: each message once."""
    b = on_each_db(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    _fresh_fold_cut_off_then_dba_ranges(b, monkeypatch)
    real = ranges_upgrade._merge_cut_off_fresh_fold

    def merge_then_die(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise Killed("killed before the merge's transaction commits")

    monkeypatch.setattr(ranges_upgrade, "_merge_cut_off_fresh_fold", merge_then_die)
    with pytest.raises(Killed):
        b.cli("init")
    monkeypatch.setattr(ranges_upgrade, "_merge_cut_off_fresh_fold", real)
    assert _has(b, ranges_upgrade.RANGES_NEW)
    assert b.cli("status") != 0
    assert b.cli("init") == 0
    assert not _has(b, ranges_upgrade.RANGES_NEW) and b.cli("status") == 0
    assert entries_without_bits(b) == []
    each_once_after_a_re_read_and_replay(b, 6, FIXED)


def test_guard_a_crash_after_the_merge_commits_before_the_fold_in_place(make, monkeypatch) -> None:
    """PASSES (guard). The merge's transaction commits, init is killed in the fold in place that
    follows: the remaining delivered entries have no bits, so commands refuse until init ends it."""
    b = make(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    _fresh_fold_cut_off_then_dba_ranges(b, monkeypatch)
    real = Ranges.mark
    calls = {"n": 0}

    def cut(self: Any, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # 1: the merge's block, 2: quarantined bits, 3: the first chunk in place
            raise Killed("killed in the fold in place")
        real(self, *args, **kwargs)

    monkeypatch.setattr(Ranges, "mark", cut)
    with pytest.raises(Killed):
        b.cli("init")
    monkeypatch.setattr(Ranges, "mark", real)
    assert not _has(b, ranges_upgrade.RANGES_NEW)
    assert b.cli("status") != 0
    assert b.cli("init") == 0 and b.cli("status") == 0
    each_once_after_a_re_read_and_replay(b, 6, FIXED)


def test_guard_a_fresh_fold_in_progress_is_not_refused_forever(make, monkeypatch) -> None:
    """PASSES (guard). A fresh fold cut off (qbridge_ledger_ranges_new, no range ledger): commands
    refuse (without_ranges), the next init finishes it, and nothing refuses after."""
    b = make(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    init_killed_at_mark(b, monkeypatch, why="cut")
    assert _has(b, ranges_upgrade.RANGES_NEW) and not _has(b, ranges_upgrade.RANGES)
    assert b.cli("status") != 0
    assert b.cli("init") == 0
    assert not _has(b, ranges_upgrade.RANGES_NEW) and b.cli("status") == 0
    each_once_after_a_re_read_and_replay(b, 6, FIXED)


def test_before_init_a_spark_units_first_attempt_delivers_a_quarantined_entry_without_its_bit(make) -> None:
    """FAILS (finding). (1) finds an earlier qbridge's cut-off fold (quarantined entries without
    bits) at init only; no command refuses that ledger. After the upgrade, before any init (nothing
    asks for one), the operator routes the type and a Spark unit re-reads a range holding that key (its
    first attempt: bits only, `_optimistic`): the quarantined key has no bit, so it is delivered; the
    quarantine replay (its entry still says quarantined) delivers it again."""
    from bridge.lifecycle.quarantine import QuarantineDesk

    b = make(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    _folded_the_earlier_way_and_cut_off(b)
    assert len(entries_without_bits(b)) == 1
    b.mapping = FIXED
    b.write_config()
    refused = b.cli("status") != 0
    if not refused:
        runner = b.runner()
        runner.check()
        runner.run_range(QUEUE, 2, 3)  # the unit whose range is the quarantined key
        QuarantineDesk(b.runner(), "ops", None).replay(None)
    ids = b.message_ids("Orders")
    assert refused or all(n == 1 for n in ids.values()), f"no command refused, and delivered twice: {ids}"
