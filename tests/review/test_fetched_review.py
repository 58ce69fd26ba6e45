"""A review of dfb3d9d ("A batch as the fetch gives it", issue 49): NGinn's fetch returns a
Fetched (bridge/sources/fetched.py), Batch._settle runs the columnar lane's share and then the
per-row rest, passes and units take keys, gaps and the high-water mark from keys_of(rows).

Each test here pins an interleaving or an input the change could have got wrong (a key list out
of step with its rows, a row settled twice or by neither, a consume of a row that must stay, a
high-water mark or gap from the wrong keys, a refused row, a Spark unit read again). They were
all checked against the current code and hold (`test_guard_...`)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.demo.samples import nginn_row
from bridge.pipeline.loop import PassStats
from bridge.sources import SourceRow
from bridge.sources.fetched import Fetched, consumable_of, joined, keys_of, ledger_keys, values_at
from bridge.sources.nginn import CONSUMABLE, NGinnSource
from bridge.targets.writer import LaneBatch
from helpers import Bridge
from tests.pipeline.test_columnar_lane import written
from tests.systems.test_fast_lane import corpus


@pytest.fixture(autouse=True, scope="module")
def _lane_from_64_rows():
    """This module's batches (70 to 200 rows) are sized for the columnar lane as it was taken
    before each source had its own threshold: from 64 new rows on (NGinn's own is more)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NGinnSource, "lane_min_rows", 64)
        yield

NAMES = ["id", "subqueue", "payload"]


# -- 1. a Fetched is the list of SourceRows it stands for ---------------------------------------
def _fetched(tuples: list[tuple[Any, ...]]) -> Fetched:
    return Fetched(NAMES, tuples, "id", int, "subqueue", CONSUMABLE.__contains__)


def _model(tuples: list[tuple[Any, ...]]) -> list[SourceRow]:
    """What the fetch made before issue 49: a SourceRow with a dict a row."""
    return [SourceRow(int(t[0]), t[1] in CONSUMABLE, dict(zip(NAMES, t))) for t in tuples]


_ROW = st.tuples(st.integers(1, 10_000), st.sampled_from(["I", "R", "F", "X", "Q"]), st.integers())
_PART = st.tuples(st.sampled_from(["fetched", "list", "empty-fetched", "empty-list"]), st.lists(_ROW, max_size=6))


def _part(kind: str, tuples: list[tuple[Any, ...]]) -> tuple[Any, list[SourceRow]]:
    if kind == "fetched":
        return _fetched(tuples), _model(tuples)
    if kind == "list":
        return _model(tuples), _model(tuples)
    if kind == "empty-fetched":
        return _fetched([]), []
    return [], []


@settings(max_examples=300, deadline=None, derandomize=True)
@given(parts=st.lists(_PART, min_size=1, max_size=4), touch=st.lists(st.integers(-30, 30), max_size=5),
       cut=st.tuples(st.none() | st.integers(-8, 8), st.none() | st.integers(-8, 8),
                     st.none() | st.integers(-3, 3).filter(lambda s: s != 0)))
def test_guard_a_fetched_joined_sliced_and_indexed_is_the_list_it_stands_for(parts: list[Any], touch: list[int],
                                                                               cut: tuple[Any, Any, Any]) -> None:
    """Joined with Fetched, lists and empty batches (on either side, as fetch_ranges' chunks and
    the pass's late + new rows are), with rows made before the join (negative indices too),
    then sliced: keys, consumable flags, rows and columns stay in step with the rows."""
    batch, model = _part(*parts[0])
    for i in touch:  # rows made before a join are kept by it
        if -len(model) <= i < len(model):
            assert batch[i] == model[i]
    for kind, tuples in parts[1:]:
        more, more_model = _part(kind, tuples)
        batch, model = joined(batch, more), model + more_model
    assert len(batch) == len(model)
    assert list(batch) == model
    assert keys_of(batch) == [r.key for r in model]
    assert consumable_of(batch) == [r.consumable for r in model]
    for i in touch:
        if -len(model) <= i < len(model):
            assert batch[i] == model[i] and batch[i].key == model[i].key
        else:
            with pytest.raises(IndexError):
                batch[i]
    assert list(batch[slice(*cut)]) == model[slice(*cut)]
    take = list(range(0, len(model), 2))
    assert values_at(batch, take, "payload") == [model[i].values["payload"] for i in take]
    assert values_at(batch, list(range(len(model))), "subqueue") == [r.values["subqueue"] for r in model]
    if isinstance(batch, Fetched):  # the join gives the rows and the keys of the batch it stands for
        assert [batch[i].key for i in range(len(batch))] == batch.keys


# -- 2. the lane's share and the per-row rest, with rows the ledger knows ------------------------
def _settle_vs_process(tmp_path: Path, lock: bool, known_outcomes: dict[int, str]) -> tuple[Any, Any, Any]:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    now = b.now_local()
    rows = corpus(now) * 3 + [nginn_row("MQueue1", n, now, subqueue="IRXF"[n % 4]) for n in range(80)]
    b.insert(rows)
    runner = b.runner()
    runner.lane_min_rows = 1
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        fetched = source.fetch_after(conn, None, 1000, False)
    assert isinstance(fetched, Fetched)
    ids = fetched.keys
    known = {str(ids[i]): outcome for i, outcome in known_outcomes.items()}
    results = []
    for columnar in (True, False):
        stats = PassStats("MQueue1")
        places: list[int] = []
        if columnar:
            outs, entries, quarantined, consume = runner._settle(None, source, fetched, lock, stats, dict(known), places)
            lane = outs[0]
        else:
            copies = [r._replace(values=dict(r.values)) for r in _model_of(fetched)]
            outs, entries, quarantined, consume = runner._process(None, source, copies, lock, stats, dict(known), places)
        results.append((written(outs, places), sorted(entries), sorted((q.source_key, q.reason) for q in quarantined),
                        sorted(consume), (stats.delivered, stats.skipped, stats.quarantined, stats.already)))
    return results[0], results[1], (lane, fetched, known)


def _model_of(f: Fetched) -> list[SourceRow]:
    return [SourceRow(k, c, dict(zip(f.names, t))) for k, c, t in zip(f.keys, f.consumable, f._tuples)]


@pytest.mark.parametrize("lock", [False, True], ids=["copy", "move"])
def test_guard_the_lane_and_the_rest_settle_each_row_once_with_rows_the_ledger_knows(tmp_path: Path, lock: bool) -> None:
    """Rows already delivered, skipped or quarantined (the ledger's `known`) among rows the lane
    takes: each row settled once, by the lane or by the rest; a known quarantined row is not
    consumed (NGinn does not consume quarantined rows), a known delivered one is; consume only of
    consumable rows (X is not)."""
    known = {0: "delivered", 5: "quarantined", 40: "skipped", 70: "delivered", 71: "quarantined", 120: "delivered",
             121: "quarantined", 122: "skipped"}
    columnar, per_row, (lane, fetched, known_keys) = _settle_vs_process(tmp_path, lock, known)
    assert isinstance(lane, LaneBatch) and sum(len(t.positions) for t in lane.tables) >= 60  # not vacuous
    assert columnar == per_row
    _written, entries, _quarantined, consume, counts = columnar
    settled = [e.source_key for e in entries]
    assert len(settled) == len(set(settled)) == len(fetched) - len(known_keys)  # each unknown row once
    assert not set(settled) & set(known_keys)
    assert counts[3] == len(known_keys)
    if lock:
        by_key = dict(zip(fetched.keys, fetched.consumable))
        assert all(by_key[k] for k in consume)
        assert not {str(k) for k in consume} & {k for k, o in known_keys.items() if o == "quarantined"}
        assert {str(k) for k in consume} >= {k for k, o in known_keys.items() if o != "quarantined" and by_key[int(k)]}
    else:
        assert consume == []


def test_guard_the_ledger_is_looked_up_with_the_batch_keys_when_known_is_none(tmp_path: Path) -> None:
    """`_settle` with known=None (a monotonic pass) looks the ledger up with the rows' ledger keys
    (from the Fetched's keys, without making its rows), and passes them to the rest."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", batch_size=70)
    assert b.cli("init") == 0
    b.insert(b.ready(140))
    runner = b.runner()
    runner.run_pass("MQueue1")  # the first 70 delivered, through the lane
    runner.lane_min_rows = 1
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as sconn:
        fetched = source.fetch_after(sconn, None, 1000, False)
    assert ledger_keys(source, fetched) == [source.ledger_key(r) for r in _model_of(fetched)]
    with runner.target_engine.connect() as tconn:
        stats = PassStats("MQueue1")
        outs, entries, _q, _c = runner._settle(tconn, source, fetched, False, stats, None)
    assert stats.already == 70 and stats.delivered == 70 and len(entries) == 70
    assert {int(e.source_key) for e in entries} == set(fetched.keys[70:])
    assert sum(len(t.positions) for t in outs[0].tables) == 70


# -- 3. late gap rows joined with new rows, in move mode, through the lane -----------------------
def _checkpoint(b: Bridge) -> tuple[int, str]:
    with b.target.connect() as conn:
        return conn.execute(sa.text(f"SELECT high, gaps FROM {b._qualified('qbridge_checkpoint')}")).one()


def _exactly_once(b: Bridge, expected: int) -> None:
    ids = b.message_ids("Orders")
    assert len(ids) == expected and set(ids.values()) == {1}


def test_guard_late_rows_and_new_rows_in_one_move_batch_are_delivered_and_consumed_once(tmp_path: Path) -> None:
    """Move mode on SQLite: ids with holes (100 rows, 3 missing), a pass through the lane; the
    missing rows commit late and 80 new rows come; one pass joins late + new (a Fetched of two
    fetches) and the lane takes both: each delivered once, each consumed, the high-water mark the
    new rows' last key and the filled gaps gone."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mode="move", batch_size=500)
    assert b.cli("init") == 0
    now = b.now_local()
    holes = {10, 50, 51}
    b.insert([{**nginn_row("MQueue1", n, now), "id": n} for n in range(1, 104) if n not in holes])
    assert b.cli("sync", "--once") == 0
    high, gaps = _checkpoint(b)
    assert high == 103 and "[10,10," in gaps and "[50,51," in gaps
    b.insert([{**nginn_row("MQueue1", n, now), "id": n} for n in [*sorted(holes), *range(104, 184)]])
    assert b.cli("sync", "--once") == 0
    high, gaps = _checkpoint(b)
    assert high == 183 and "[10," not in gaps and "[50," not in gaps
    _exactly_once(b, 183)
    assert set(b.subqueues().values()) == {"X"}
    assert b.cli("verify") == 0


def test_guard_a_quarantined_row_in_a_lane_batch_stays_unconsumed_in_move_mode(tmp_path: Path) -> None:
    """Move mode: a row the per-row lanes quarantine (a subqueue NGinn does not define) among 100
    the lane takes is recorded quarantined and left in its subqueue; every other row is consumed."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mode="move")
    assert b.cli("init") == 0
    now = b.now_local()
    rows = [nginn_row("MQueue1", n, now) for n in range(1, 101)]
    rows[40] = nginn_row("MQueue1", 41, now, subqueue="Q")
    rows[60] = nginn_row("MQueue1", 61, now, body="{not json")  # quarantined, and consumable (I)
    ids = b.insert(rows)
    assert b.cli("sync", "--once") == 0
    subqueues = b.subqueues()
    assert subqueues[ids[40]] == "Q" and subqueues[ids[60]] == "I"
    assert sorted(k for k, s in subqueues.items() if s != "X") == [ids[40], ids[60]]
    _exactly_once(b, 98)
    assert b.ledger()["quarantined"] == 2
    assert b.cli("sync", "--once") == 0  # read again (a gap? no: above the mark) - nothing more
    _exactly_once(b, 98)


# -- 4. a row the target refuses, in a batch the lane took ---------------------------------------
@pytest.mark.parametrize("lock", [False, True], ids=["copy", "move"])
def test_guard_a_refused_row_of_a_fetched_batch_is_quarantined_and_not_consumed(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch,
                                                                                lock: bool) -> None:
    """The lane's write refused (as a value no encoder takes is): the batch again by the per-row
    lanes over the same Fetched, the refused row quarantined (and, in move mode, left), the rest
    delivered and consumed once; the ledger holds each row once."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db",
               mode="move" if lock else "copy")
    assert b.cli("init") == 0
    now = b.now_local()
    rows = [nginn_row("MQueue1", n, now, headers="Tenant=acme") for n in range(1, 101)]
    rows[33] = nginn_row("MQueue1", 34, now, headers="Tenant=poison")
    ids = b.insert(rows)
    runner = b.runner()
    write = runner.target.write
    seen = {"lane": 0}

    def refusing(conn: sa.Connection, outs: Any) -> None:
        for out in outs:
            if isinstance(out, LaneBatch):
                seen["lane"] += 1
                raise ValueError("refused: the lane's batch holds the poison")
            if "poison" in str(getattr(out, "headers", "")):
                raise ValueError("refused: poison")
        write(conn, outs)

    monkeypatch.setattr(runner.target, "write", refusing)
    runner.run_pass("MQueue1")
    assert seen["lane"] == 1  # not vacuous: the lane took the batch first
    _exactly_once(b, 99)
    ledger = b.ledger()
    assert ledger["quarantined"] == 1 and ledger["delivered"] == 99
    subqueues = b.subqueues()
    if lock:
        assert [k for k, s in subqueues.items() if s != "X"] == [ids[33]]
    else:
        assert set(subqueues.values()) == {"I"}


# -- 5. a Spark unit (run_range) on a Fetched: gaps from its keys, a unit run again ----------------
@pytest.mark.parametrize("mode", ["copy", "move"])
def test_guard_a_range_unit_gives_its_gaps_from_the_fetched_keys_and_a_rerun_doubles_nothing(tmp_path: Path,
                                                                                             mode: str) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", batch_size=70, mode=mode)
    assert b.cli("init") == 0
    now = b.now_local()
    present = [n for n in range(1, 221) if n not in {5, 6, 70, 71, 140, 200}]
    b.insert([{**nginn_row("MQueue1", n, now), "id": n} for n in present])
    runner = b.runner()
    result = runner.run_range("MQueue1", None, 230)
    gaps = sorted((g.lo, g.hi) for g in result.gaps)
    assert gaps == [(5, 6), (70, 71), (140, 140), (200, 200), (221, 230)]
    assert result.stats.delivered == len(present)
    import bridge.faults as faults

    faults.attempt = 1  # a retried task attempt: looks the ledger up
    try:
        again = b.runner().run_range("MQueue1", None, 230)
    finally:
        faults.attempt = None
    assert again.stats.delivered == 0
    _exactly_once(b, len(present))
    if mode == "move":
        assert set(b.subqueues().values()) == {"X"}


# -- 6. MariaDB (pyodbc) and PostgreSQL as the legacy side, through a pass ------------------------
def _late_and_new(b: Bridge) -> None:
    now = b.now_local()
    b.insert([{**nginn_row("MQueue1", n, now, subqueue="IRXF"[n % 4] if n % 7 else "I"), "id": n}
              for n in range(1, 91) if n not in (20, 21)])
    assert b.cli("sync", "--once") == 0
    b.insert([{**nginn_row("MQueue1", n, now - timedelta(hours=1)), "id": n} for n in (20, 21, *range(91, 171))])
    assert b.cli("sync", "--once") == 0
    high, gaps = _checkpoint(b)
    assert high == 170 and "[20," not in gaps
    delivered = b.message_ids("Orders") + b.message_ids("error")
    assert set(delivered.values()) == {1}
    ledger = b.ledger()
    assert sum(ledger.values()) == 170, ledger
    left = {k: s for k, s in b.subqueues().items() if s != "X"}
    assert left == {}, left
    assert b.cli("verify") == 0


def test_guard_late_and_new_rows_in_move_mode_on_mariadb(mariadb_database: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, mariadb_database, f"sqlite:///{tmp_path}/nsb.db", mode="move")
    assert b.cli("init") == 0
    _late_and_new(b)


@pytest.mark.postgres
def test_guard_late_and_new_rows_in_move_mode_on_postgresql(make: Any) -> None:
    _late_and_new(make(mode="move"))
