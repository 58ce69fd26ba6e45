"""Review of 22ae29c..HEAD (session 8): packed transport row ids (row_id_bytes), the NGinn
columnar lane's batched checks (one search of the five texts, one UTC call and one wire pass
over the three times, failure columns by mask), and BizTalk's key walks on PostgreSQL reading
the ids as the server's text (sort_of_row)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import Bridge, sqlite_nginn
from sqlalchemy.dialects import mssql, postgresql, sqlite

from bridge.demo.samples import nginn_row
from bridge.model import row_id_bytes, row_ids
from bridge.pipeline.columnar import lane
from bridge.sources.fetched import ledger_keys
from tests.pipeline.test_columnar_lane import both_lanes
from tests.systems.test_biztalk_source import BizTalk, make_bt

QUEUE = "BizTalkServerApplication"


# -- NGinn columnar lane -------------------------------------------------------------------------

def _lane_rows(b: Bridge) -> int:
    """How many rows of the queue's first batch the columnar lane itself settles (written or
    skipped; 0: none, the per-row lanes took the whole batch)."""
    runner = b.runner()
    runner.lane_min_rows = 1
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    took = lane(runner, source, rows, ledger_keys(source, rows), {}, False)
    return 0 if took is None else int(took.taken.sum())


@pytest.mark.parametrize("odd", ["retry_time of a ready row", "last_processed of a processed row"])
def test_an_unused_time_out_of_the_wire_range_keeps_the_batch_on_the_lane(tmp_path: Path, odd: str) -> None:
    """FINDING (fixed after this review). A ready row's retry_time (a processed row's
    last_processed) is never written: the per-row lanes and the lane before 69d759d ignore it
    (due/failed_at were wired only for the R/F rows, `_wire_where`). 69d759d rendered every kept
    row's three times in one `_wire` pass; 0001-01-01 00:30 in Warsaw (.NET's DateTime.MinValue
    as a 'never') is in year 0 in UTC, `_EPOCH + timedelta` raised OverflowError out of
    plain_columns, and every row of a batch holding such a row went the per-row way with a
    WARNING and a trace: the lane took 0 of 4 rows. Now the unused times are nulled first."""
    now = datetime.now().replace(microsecond=0)
    rows = [nginn_row("MQueue1", n, now) for n in range(1, 4)]
    if odd.startswith("retry_time"):
        rows.append(nginn_row("MQueue1", 4, now, retry_time=datetime(1, 1, 1, 0, 30)))
    else:
        rows.append({**nginn_row("MQueue1", 4, now, subqueue="X"), "last_processed": datetime(1, 1, 1, 0, 30)})
    b = sqlite_nginn(tmp_path, rows)
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row  # nothing wrong is written: the fallback is the per-row lanes
    assert _lane_rows(b) == 4


def test_guard_control_characters_across_column_boundaries_and_nulls(tmp_path: Path) -> None:
    """The five texts searched end to end: a row with NULLs in them and a row whose columns end
    and begin next to each other are taken, a control character in any one of them leaves only
    that row out, and both lanes write the same."""
    now = datetime.now().replace(microsecond=0)
    rows = [{**nginn_row("MQueue1", 1, now), "correlation_id": None, "label": None, "unique_id": None},
            {**nginn_row("MQueue1", 2, now), "from_endpoint": "sql://db/Sender\\", "to_endpoint": "x1f"},
            {**nginn_row("MQueue1", 3, now), "label": "ok\x1fno"},
            {**nginn_row("MQueue1", 4, now), "unique_id": "\x00"},
            nginn_row("MQueue1", 5, now)]
    b = sqlite_nginn(tmp_path, rows)
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row
    assert _lane_rows(b) == 3


def test_guard_times_and_failures_sliced_right_when_rows_are_left_out(tmp_path: Path) -> None:
    """Rows left out between kept ones (a bad state, a non-object body, a failed row without an
    exception type) shift nothing: each kept row's sent/due/failed_at and exception columns are
    its own (distinct times per row), failed rows with and without an inner exception."""
    base = datetime(2026, 7, 1, 12, 0, 0, 123456)
    err = "System.InvalidOperationException: outer ---> System.IO.IOException: inner\r\n   at A.B()"
    rows = []
    for n in range(1, 25):
        t = base.replace(minute=n, microsecond=n)
        kind = n % 6
        if kind == 0:
            rows.append({**nginn_row("MQueue1", n, t, subqueue="F", error_info=err), "last_processed": t.replace(hour=13)})
        elif kind == 1:
            rows.append(nginn_row("MQueue1", n, t, subqueue="R", retry_time=t.replace(hour=15)))
        elif kind == 2:
            rows.append(nginn_row("MQueue1", n, t, subqueue="F", error_info="System.Exception: boom\r\n   at X.Y()"))
        elif kind == 3:
            rows.append(nginn_row("MQueue1", n, t, subqueue="Z"))
        elif kind == 4:
            rows.append(nginn_row("MQueue1", n, t, subqueue="F", error_info="the disk was full"))
        else:
            rows.append(nginn_row("MQueue1", n, t, body="[1, 2]") if n % 12 == 5 else nginn_row("MQueue1", n, t))
    b = sqlite_nginn(tmp_path, rows)
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row
    assert _lane_rows(b) >= 12


# -- transport row ids ---------------------------------------------------------------------------

def test_guard_row_id_bytes_layout_order_and_no_carry() -> None:
    """Each 16 bytes are uuid.UUID.bytes (big-endian, PostgreSQL's binary uuid) of a v7 id with
    RFC 4122's variant, the counter in the low 20 bits from 0, the high word one per base, ids
    strictly growing within a base and distinct across calls and across the 2**20 boundary."""
    n = (1 << 20) + 5
    packed = row_id_bytes(n)
    ints = [int.from_bytes(packed[i:i + 16], "big") for i in range(0, len(packed), 16)]
    assert len(ints) == n
    for part in (ints[:1 << 20], ints[1 << 20:]):
        assert all(b - a == 1 for a, b in pairwise(part))
        assert part[0] & 0xFFFFF == 0 and (part[-1] & 0xFFFFF) == len(part) - 1
        assert len({i >> 64 for i in part}) == 1  # nothing carried into the high word
        u = uuid.UUID(int=part[0])
        assert u.version == 7 and u.variant == uuid.RFC_4122 and uuid.UUID(bytes=packed[:16]).int == ints[0]
    assert len(set(ints)) == n
    again = row_id_bytes(3000)
    assert not {int.from_bytes(again[i:i + 16], "big") for i in range(0, 48000, 16)} & set(ints)
    # the same layout as row_ids: version, variant and the 48-bit milliseconds of now
    now = time.time_ns() // 1_000_000
    assert abs((ints[-1] >> 80) - now) < 60_000 and abs((row_ids(1)[0].int >> 80) - now) < 60_000
    assert (ints[0] >> 62) & 3 == (row_ids(1)[0].int >> 62) & 3 == 2


def test_guard_copied_ids_read_back_as_the_packed_uuids(make) -> None:
    """On PostgreSQL the lane's COPY BINARY writes the packed ids: the server reads each as a v7
    uuid of now (byte order right), all distinct, growing in the order the rows were written."""
    b = make(batch_size=400)  # NGinn's lane takes batches from 384 rows on
    b.insert(b.ready(450))
    assert b.cli("sync", "--once") == 0
    with b.target.connect() as conn:
        ids = [r[0] for r in conn.execute(sa.text(f"SELECT id FROM {b._qualified('Orders')} ORDER BY seq"))]
    assert len(ids) == 450 == len(set(ids))
    now = time.time_ns() // 1_000_000
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 and abs((i.int >> 80) - now) < 600_000 for i in ids)
    assert sum(b < a for a, b in pairwise(ids)) <= 3  # one fall at most per batch's fresh base


# -- BizTalk key walks -------------------------------------------------------------------------

EDGE = [uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1), uuid.UUID("80000000-0000-0000-0000-000000000000"),
        uuid.UUID("7fffffff-ffff-ffff-ffff-ffffffffffff"), uuid.UUID("00000000-0000-0000-8000-000000000000"),
        uuid.UUID("ABCDEF01-2345-6789-ABCD-EF0123456789")]


@pytest.fixture(params=["sqlite", "postgres"])
def bt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BizTalk]:
    yield from make_bt(request.param, request, tmp_path)


def _entries(bt: BizTalk) -> list[tuple[str, uuid.UUID, uuid.UUID]]:
    """Queue and suspended entries with edge ids (the walks read only the two queue tables)."""
    out = []
    with bt.source.begin() as conn:
        for prefix, table in (("Q", f"{QUEUE}Q"), ("S", f"{QUEUE}Q_Suspended")):
            for m in EDGE:
                for i in (EDGE[0], EDGE[1], uuid.uuid4()):
                    conn.execute(bt.bt[table].insert().values(uidMessageID=m, uidInstanceID=i))
                    out.append((prefix, m, i))
    return out


def test_guard_biztalk_walks_spell_keys_as_str_uuid_and_page_each_once(bt: BizTalk) -> None:
    """The keys every walk gives (iter_keys, slice_page paged across the Q/S boundary, iter_sent,
    a walk resumed after a key) are f"{prefix}:{UUID}:{UUID}" as the ledger holds them from
    before, in the keyset's order, each once; a page's sort tuple is (str, UUID, UUID), the type
    of slice_boundaries' (Spark compares and pickles both)."""
    entries = _entries(bt)
    runner = bt.runner()
    source = runner.sources[QUEUE]
    # the keyset's order is the database's uuid order, read back as UUIDs from keyset() itself
    with runner.source_engine.connect() as conn:
        k = source.keyset()
        order = [tuple(r) for r in conn.execute(sa.select(*k.c).order_by(*k.c))]
    assert sorted(order) == sorted(entries)
    expected = [f"{p}:{m}:{i}" for p, m, i in order]
    with runner.source_engine.connect() as conn:
        assert list(source.iter_keys(conn)) == expected
        assert [k for k, _ in source.iter_sent(conn)] == expected
        paged, cursor = [], None
        while True:
            chunk, last = source.slice_page(conn, cursor, None, 4)
            if not chunk:
                break
            assert last == source.sort_of(chunk[-1]) and [type(v) for v in last] == [str, uuid.UUID, uuid.UUID]
            paged += chunk
            cursor = last
        assert paged == expected
        bounds = source.slice_boundaries(conn, 5)
        assert all([type(v) for v in b] == [str, uuid.UUID, uuid.UUID] for b in bounds)
        sliced, lower = [], None
        for upto in [*bounds, None]:
            sliced += list(source.iter_slice(conn, lower, upto))
            lower = upto
        assert sliced == expected
        at = expected.index(f"S:{EDGE[0]}:{EDGE[1]}")
        assert [k for k, _ in source.iter_aged(conn, source.sort_of(expected[at]), 3)] == expected[at + 1:]
        assert all(str(r.key) == k for r, k in zip(source.fetch_keys(conn, expected, False), expected))


def test_guard_biztalk_walks_cast_only_on_postgresql(tmp_path: Path) -> None:
    """SQL Server and SQLite select the uuid columns as before (no CAST); PostgreSQL casts what it
    shows, never what it orders or compares."""
    b = BizTalk(tmp_path, f"sqlite:///{tmp_path}/msgbox.db", f"sqlite:///{tmp_path}/nsb.db", system="biztalk", queues=[QUEUE])
    b.seed()
    assert b.cli("init") == 0
    source = b.runner().sources[QUEUE]
    after = ("Q", EDGE[2], EDGE[3])
    for name, dialect in (("mssql", mssql.dialect()), ("sqlite", sqlite.dialect())):
        for stmt in source._slices(after, ("S", EDGE[3], EDGE[2]), name):
            assert "CAST" not in str(stmt.compile(dialect=dialect)).upper()
    for stmt in source._slices(after, None, "postgresql"):
        text = str(stmt.compile(dialect=postgresql.dialect()))
        select, rest = text.split("FROM", 1)
        assert select.count("CAST") == 2 and "CAST" not in rest
    b.dispose()
