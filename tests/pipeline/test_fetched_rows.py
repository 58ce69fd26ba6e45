"""A batch as the fetch gives it (issue 49, bridge.sources.fetched): the rows a list of SourceRows
held, on each database's driver; the columnar lane reads its columns without making a row
object for a row it takes; and the passes' keys, gaps and high-water mark are the rows' own."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.demo.samples import nginn_row
from bridge.pipeline.loop import PassStats
from bridge.sources import SourceRow
from bridge.sources.fetched import Fetched, joined, keys_of, values_at
from bridge.sources.nginn import CONSUMABLE
from helpers import Bridge


def _rows(b: Bridge) -> list[dict[str, Any]]:
    now = b.now_local().replace(microsecond=0)
    # every state, a header with a TTL, a NULL column, a row the lane leaves (a bad subqueue)
    rows = [nginn_row("MQueue1", n, now, subqueue="IRXF"[n % 4], headers="Tenant=acme") for n in range(1, 41)]
    rows.append(nginn_row("MQueue1", 41, now, headers="NGinn.TTL=2099-01-01T00:00:00"))
    rows.append({**nginn_row("MQueue1", 42, now), "label": None})
    rows.append(nginn_row("MQueue1", 43, now, subqueue="Q"))
    return rows


def _as_dicts(b: Bridge) -> list[SourceRow]:
    """The rows as the fetch made them before issue 49: a dict a row."""
    t = b.tables["MQueue1"]
    with b.source.connect() as conn:
        result = conn.execute(sa.select(t).order_by(t.c.id))
        names = list(result.keys())
        return [SourceRow(int(v["id"]), v["subqueue"] in CONSUMABLE, v) for v in (dict(zip(names, r)) for r in result)]


def _check_the_same_rows(b: Bridge) -> None:
    b.insert(_rows(b))
    runner = b.runner()
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        got = source.fetch_after(conn, None, 1000, False)
    assert isinstance(got, Fetched)
    want = _as_dicts(b)
    assert len(got) == len(want) == 43
    assert keys_of(got) == [r.key for r in want] and got.consumable == [r.consumable for r in want]
    assert list(got) == want and got[3] == want[3] and got[-2:] == want[-2:]
    assert values_at(got, [0, 5, 42], "subqueue") == [want[i].values["subqueue"] for i in (0, 5, 42)]
    assert values_at(got, list(range(43)), "label") == [r.values["label"] for r in want]


def test_a_fetched_batch_holds_the_rows_a_list_held_on_sqlite(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    _check_the_same_rows(b)


def test_a_fetched_batch_holds_the_rows_a_list_held_on_postgresql(make: Any) -> None:
    _check_the_same_rows(make())


def test_a_fetched_batch_holds_the_rows_a_list_held_on_mariadb(mariadb_database: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, mariadb_database, f"sqlite:///{tmp_path}/nsb.db", flavor="postgresql")
    assert b.cli("init") == 0
    _check_the_same_rows(b)


@pytest.mark.parametrize("lock", [False, True], ids=["copy", "move"])
def test_the_lane_makes_no_row_object_for_a_row_it_takes(tmp_path: Path, lock: bool) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    b.insert(_rows(b))
    runner = b.runner()
    runner.lane_min_rows = 1
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        got = source.fetch_after(conn, None, 1000, False)
    stats = PassStats("MQueue1")
    outs, entries, quarantined, consume = runner._settle(None, source, got, lock, stats, {})
    made = [i for i in range(len(got)) if got._rows[i] is not None]
    lane = outs[0]
    by_lane = sum(len(t.positions) for t in lane.tables)
    assert by_lane >= 30, by_lane  # not vacuous: the lane took the ordinary rows
    # the rows the per-row lanes settled (the TTL row, the bad subqueue), and one example a group
    assert len(made) <= len(got) - by_lane + 8, (made, by_lane)
    assert {41, 43} <= {got.keys[i] for i in made}
    assert stats.delivered + stats.skipped + stats.quarantined == 43
    assert len(entries) == 43 and len(quarantined) == 1
    assert sorted(consume) == (sorted(k for k, c in zip(got.keys, got.consumable) if c and k != 43) if lock else [])


def test_two_fetched_batches_join_in_order_and_keep_their_rows(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    b.insert(_rows(b))
    source = b.runner().sources["MQueue1"]
    with b.source.connect() as conn:
        late = source.fetch_ranges(conn, [(3, 4), (40, 41)], False)
        new = source.fetch_after(conn, 41, 1000, False)
        empty = source.fetch_ranges(conn, [], False)
    first = late[0]  # made before the join: the joined batch keeps it
    both = joined(late, new)
    assert isinstance(both, Fetched) and keys_of(both) == [3, 4, 40, 41, 42, 43]
    assert both[0] is first and [r.key for r in both] == [3, 4, 40, 41, 42, 43]
    assert keys_of(joined(empty, new)) == [42, 43] and keys_of(joined(new, [])) == [42, 43]
    assert keys_of(joined([], [])) == []
    plain = [SourceRow(7, True, {})]
    assert keys_of(joined(plain, new)) == [7, 42, 43] and keys_of(joined(new, plain)) == [42, 43, 7]


def test_a_pass_moves_the_high_water_mark_and_gaps_from_the_fetched_keys(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", batch_size=10)
    assert b.cli("init") == 0
    now = datetime.now().replace(microsecond=0)
    b.insert([{**nginn_row("MQueue1", n, now), "id": n} for n in (1, 2, 5, 6, 9)])
    assert b.cli("sync", "--once") == 0
    with b.target.connect() as conn:
        high, gaps = conn.execute(sa.text("SELECT high, gaps FROM qbridge_checkpoint")).one()
    assert high == 9 and "[3,4," in gaps and "[7,8," in gaps
    b.insert([{**nginn_row("MQueue1", n, now), "id": n} for n in (3, 7, 10)])
    assert b.cli("sync", "--once") == 0
    with b.target.connect() as conn:
        high, gaps = conn.execute(sa.text("SELECT high, gaps FROM qbridge_checkpoint")).one()
        assert conn.execute(sa.text('SELECT count(*) FROM "Orders"')).scalar() == 8
    assert high == 10 and "[4,4," in gaps and "[8,8," in gaps
