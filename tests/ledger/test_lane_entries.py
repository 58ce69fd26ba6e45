"""The columnar lane's ledger entries as columns (bridge/ledger/lane_entries.py, issue 49): a
range ledger's bits made a block at a time are the bits a key at a time sets, and a batch
recorded from LaneEntries leaves the ledger, its range rows and its totals exactly as the same
entries recorded one LedgerEntry a row did, on PostgreSQL and SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.ledger.lane_entries import LaneEntries, LaneGroup
from bridge.ledger.ranges import MASK, SHIFT, AlreadyRecorded, block_bits
from bridge.ledger.state import LedgerEntry, State
from bridge.ledger.totals import batch_counts


@settings(max_examples=300, deadline=None)
@given(st.sets(st.one_of(st.integers(0, 5000), st.integers(2 ** 40, 2 ** 40 + 3000), st.integers(2 ** 62, 2 ** 62 + 2048))))
def test_a_blocks_bits_are_the_bits_its_keys_set_one_by_one(keys: set[int]) -> None:
    one_by_one: dict[int, int] = {}
    for k in keys:
        one_by_one[k >> SHIFT] = one_by_one.get(k >> SHIFT, 0) | 1 << (k & MASK)
    assert dict(block_bits(np.array(sorted(keys), dtype=np.int64))) == one_by_one


def _lane() -> LaneEntries:
    """Rows 0..9 of a lane: delivered to two tables, and skipped by two rules (one not ASCII)."""
    keys = [str(k) for k in (5, 1023, 1024, 1030, 3000, 7, 2048, 9, 4095, 4096)]
    mids = [f"m-{k}" for k in keys]
    return LaneEntries(mids, keys, [
        LaneGroup(np.array([0, 2, 4]), "delivered", "Orders"),
        LaneGroup(np.array([1, 3]), "delivered", "Orders.Delayed"),
        LaneGroup(np.array([5, 9]), "skipped", None, "rule: test traffic"),
        LaneGroup(np.array([6, 7, 8]), "skipped", None, "rule: café"),
    ])


def _rest() -> list[LedgerEntry]:
    """The per-row lanes' entries of the same batch: one delivered, one quarantined."""
    return [LedgerEntry("m-11", "11", "delivered", "Orders"), LedgerEntry("m-12", "12", "quarantined", None, "bad json")]


def test_iterated_they_are_the_entries_the_lane_listed_a_row_each() -> None:
    lane = _lane().with_rest(_rest())
    assert len(lane) == 12
    got = list(lane)
    assert got[:3] == [LedgerEntry("m-5", "5", "delivered", "Orders"), LedgerEntry("m-1024", "1024", "delivered", "Orders"),
                       LedgerEntry("m-3000", "3000", "delivered", "Orders")]
    assert got[5] == LedgerEntry("m-7", "7", "skipped", None, "rule: test traffic")
    assert got[-2:] == _rest()
    assert lane.counts() == batch_counts(got)


@pytest.fixture(params=["postgres", "sqlite"])
def state(request, tmp_path: Path) -> Any:
    if request.param == "postgres":
        url, schema = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_schema")
    else:
        url, schema = f"sqlite:///{tmp_path}/s.db", None
    from bridge.db import engine_for

    engine = engine_for(url)
    s = State(schema)
    for t in s.all_tables():
        t.create(engine)
    yield engine, s
    for t in reversed(s.all_tables()):
        t.drop(engine)
    engine.dispose()


def _books(engine: sa.Engine, s: State, origin: int) -> tuple[list[Any], list[Any], list[Any]]:
    """The ledger's entries, range rows and totals of `origin`, without the times they were written."""
    with engine.connect() as conn:
        l, r, t = s.ledger, s.ranges.table, s.totals.table
        ledger = conn.execute(sa.select(*(c for c in l.c if c.name not in ("at", "origin"))).where(l.c.origin == origin)
                              .order_by(l.c.source_key)).all()
        ranges = conn.execute(sa.select(*(c for c in r.c if c.name not in ("at", "origin"))).where(r.c.origin == origin)
                              .order_by(r.c.block)).all()
        totals = conn.execute(sa.select(t.c.outcome, t.c.reason, t.c.n).where(t.c.origin == origin)).all()
    return [tuple(x) for x in ledger], [tuple(x) for x in ranges], sorted(tuple(x) for x in totals)


@pytest.mark.parametrize("ranged", [True, False], ids=["ranges", "per-message"])
def test_a_batch_recorded_from_columns_is_the_batch_recorded_a_row_each(state, ranged: bool) -> None:
    engine, s = state
    with engine.begin() as conn:
        s.record(conn, "job1", "q", 1, _lane().with_rest(_rest()), [], ranged=ranged)
        s.record(conn, "job1", "q", 2, list(_lane()) + _rest(), [], ranged=ranged)
    assert _books(engine, s, 1) == _books(engine, s, 2)
    ledger, ranges, totals = _books(engine, s, 1)
    assert len(ledger) == (1 if ranged else 12) and len(ranges) == (5 if ranged else 0)
    assert totals == [("delivered", None, 6), ("quarantined", None, 1), ("skipped", "rule: café", 3),
                      ("skipped", "rule: test traffic", 2)]


def test_a_lane_key_with_a_bit_already_is_refused_and_nothing_of_the_batch_stays(state) -> None:
    engine, s = state
    with engine.begin() as conn:
        s.ranges.mark(conn, 1, [(3000, "delivered")])
    with pytest.raises(AlreadyRecorded, match="key 3000"):
        with engine.begin() as conn:
            s.record(conn, "job1", "q", 1, _lane(), [], ranged=True)
    with engine.connect() as conn:
        assert list(s.ranges.stream(conn, 1)) == [(3000, "delivered")]
