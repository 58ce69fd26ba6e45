"""Review of 413e9fd (`qbridge init`'s fold gives a queue's quarantined entries their bits first, in
one transaction; `ranges_upgrade.unfolded` reads only the delivered and skipped entries, plus
whether a queue with entries has no range row at all).

The claim: `unfolded` is True in every state in which an entry of a ranged queue lacks its bit.
It holds for the states THIS fold can leave; it does not hold for the state every earlier fold
left when cut off (quarantined entries' bits last: range rows there, no delivered or skipped
entry left, the quarantined entries without bits), which a63fe94 detected and 413e9fd no longer
does, nor for a fresh fold (bits in qbridge_ledger_ranges_new) cut off before a range ledger is
created in place. And the tests of tests/review/test_known_by_bits_review.py that cut a fold off
"once its delivered entries are bits" now cut it off in its first transaction, before anything is
folded: they no longer make the state they describe.

Each test says whether it FAILED (a finding, fixed since) or PASSES (a guard: checked and found sound).
A fourth finding, that tests/review/test_known_by_bits_review.py's cut-off fold now kills the fold
in its first transaction, is mended in that helper's docstring.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from helpers import (
    BY_TYPE,
    FIXED,
    Killed,
    each_once_after_a_re_read_and_replay,
    entries_without_bits,
    init_killed_at_mark,
    unfold_ranges,
    unrouted_rows,
)

from bridge.ledger import ranges_upgrade
from bridge.ledger.ranges import Ranges

QUEUE = "MQueue1"


def _earlier_ledger(b: Any) -> None:
    """Six NGinn messages, the third of an unrouted type (quarantined); then the ledger as an
    earlier qbridge made it: every key an entry, no range ledger."""
    b.insert(unrouted_rows(b.now_local(), {3}, 6))
    assert b.cli("sync", "--once") == 0
    assert b.ledger() == {"delivered": 5, "quarantined": 1}
    assert unfold_ranges(b) == 5




def _unfolded(b: Any) -> bool:
    runner = b.runner()
    with runner.target_engine.connect() as conn:
        return ranges_upgrade.unfolded(conn, runner.state, runner.origins[QUEUE])


def _folded_the_earlier_way_and_cut_off(b: Any) -> None:
    """What `qbridge init` did up to 413e9fd (add_ranges at 413e9fd^, a63fe94 and every release
    before it) where the range ledger was in place (DBA-made): the queue's delivered and skipped
    entries folded into bits and deleted, chunk by chunk, and LAST, in a transaction of its own,
    the quarantined entries' bits; the process killed before that last transaction."""
    runner = b.runner()
    state, origin = runner.state, runner.origins[QUEUE]
    runner.state.ranges.table.create(b.target)  # the DBA, from `init --print-sql`'s DDL
    l, ranges = state.ledger, Ranges(state.ranges.table)
    mine = (l.c.origin == origin, l.c.outcome.in_(ranges_upgrade.FOLDED))
    with runner.target_engine.begin() as conn:
        page = conn.execute(sa.select(l.c.source_key, l.c.outcome).where(*mine).with_for_update()).all()
        ranges.mark(conn, origin, [(int(k), o) for k, o in page], merge=True)
        conn.execute(sa.delete(l).where(*mine, l.c.source_key.in_([k for k, _ in page])))
    # killed here: the quarantined entries' transaction never ran


# -- 413e9fd: what unfolded no longer sees --------------------------------------------------------


def test_a_fold_cut_off_by_an_earlier_qbridge_is_no_longer_unfolded(make) -> None:
    """FAILED (defect, a regression of a63fe94; fixed: init reads every quarantined entry for one without its bit). An init of the qbridge before 413e9fd, killed between
    its last delivered chunk and its quarantined transaction, left range rows, no delivered or
    skipped entry, and a quarantined entry without its bit (the state a63fe94 was made for). The
    operator upgrades to 413e9fd and runs init again: `unfolded` sees range rows and no delivered
    entry without a bit, so init folds nothing and no command refuses; the entry stays without
    its bit."""
    b = make(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    _folded_the_earlier_way_and_cut_off(b)
    assert len(entries_without_bits(b)) == 1  # the quarantined entry
    assert b.cli("init") == 0
    assert entries_without_bits(b) == [] or b.cli("status") != 0, \
        "a quarantined entry without its bit, and neither init folds it nor any command refuses"


def test_after_an_earlier_qbridges_cut_off_fold_the_quarantined_message_is_delivered_twice(make) -> None:
    """FAILED (defect, the consequence; fixed: init folds it, and passes read the entries again). The same ledger after the upgrade and init: the operator
    routes the type, a copy pass reads the queue again (bits only: the quarantined key is unknown,
    so it is delivered) and `quarantine replay` (its entry still says quarantined) delivers it once
    more. With a63fe94 the second init folded it and both found it 'already there'."""
    b = make(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    _folded_the_earlier_way_and_cut_off(b)
    assert b.cli("init") == 0
    each_once_after_a_re_read_and_replay(b, 6, FIXED)


def test_a_fresh_fold_cut_off_then_a_dba_made_range_ledger_loses_the_folded_keys(make, monkeypatch) -> None:
    """FAILED (defect, older than 413e9fd; the "fresh" path; fixed: commands refuse while the new range ledger is left beside the one in place, and init merges it in). No range ledger: init folds into
    qbridge_ledger_ranges_new, deleting each chunk's entries, and is killed after its first chunk.
    A DBA then creates qbridge_ledger_ranges from `init --print-sql`'s DDL (which lists it). The
    next init takes the ledger in place (not fresh), folds what entries are left into it and never
    looks at qbridge_ledger_ranges_new: the keys of the first chunk now have neither entry nor bit,
    `unfolded` says False, every command runs, and a copy pass reading the queue again delivers
    them a second time."""
    b = make(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    init_killed_at_mark(b, monkeypatch)  # in the second chunk's transaction
    assert b.cli("status") != 0  # no qbridge_ledger_ranges: refused, as it should be
    b.runner().state.ranges.table.create(b.target)  # the DBA, from `init --print-sql`'s DDL
    assert b.cli("init") == 0
    assert b.cli("status") == 0
    each_once_after_a_re_read_and_replay(b, 6, FIXED)


# -- guards -------------------------------------------------------------------------------------------


def test_guard_this_folds_cut_off_points_are_all_unfolded(make, monkeypatch) -> None:
    """PASSES (guard). A DBA-made range ledger, entries folded two a transaction, init killed in each
    of its transactions in turn: `unfolded` is True after every kill (no range row before the
    quarantined transaction; delivered entries without bits after it), False once it finishes, and
    no entry is left without a bit."""
    b = make(batch_size=10, mapping=BY_TYPE)
    _earlier_ledger(b)
    b.runner().state.ranges.table.create(b.target)
    monkeypatch.setattr(ranges_upgrade, "CHUNK", 2)
    real = Ranges.mark
    k = 1
    while True:
        calls = {"n": 0}

        def cut(self: Any, *args: Any, _k: int = k, _calls: dict[str, int] = calls, **kwargs: Any) -> None:
            _calls["n"] += 1
            if _calls["n"] == _k:
                raise Killed(f"killed in transaction {_k}")
            real(self, *args, **kwargs)

        monkeypatch.setattr(Ranges, "mark", cut)
        try:
            b.cli("init")
        except Killed:
            monkeypatch.setattr(Ranges, "mark", real)
            assert _unfolded(b), f"cut off in transaction {k}, not unfolded"
            k += 1
            continue
        monkeypatch.setattr(Ranges, "mark", real)
        break
    assert k >= 4 and not _unfolded(b) and entries_without_bits(b) == []


def test_guard_zero_bit_rows_of_a_rollback_do_not_hide_or_block(make) -> None:
    """PASSES (guard). A folded queue whose bits a rollback cleared (rows of zero bits left) with a
    quarantined entry that keeps its bit: `unfolded` is False (no refusal forever)."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {3}, 6))
    assert b.cli("sync", "--once") == 0
    assert b.cli("rollback", "--job", "job1", "--yes") == 0
    assert b.ledger() == {"quarantined": 1}
    assert not _unfolded(b) and b.cli("status") == 0
