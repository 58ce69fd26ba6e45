"""The columnar lane (issue 37) makes exactly what the per-row lanes make: the same transport
rows in the same tables and order (headers byte for byte, so parsed and in order too), bodies,
ids, expiry and due times, the same ledger entries, skips, quarantine and consumes, for NGinn
rows of every shape Hypothesis can think of, under every mapping the fast-lane test uses. Then,
on PostgreSQL (COPY BINARY from Arrow) and SQLite (executemany), the tables a sync writes with
the lane equal those it writes without."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs.nservicebus import headers_json
from bridge.demo.samples import nginn_body
from bridge.pipeline.loop import PassStats
from bridge.targets.writer import LaneBatch
from helpers import Bridge
from tests.systems.test_fast_lane import MAPPINGS, corpus

NAMES = ["_NG-ReplyTo", "_NG_MsgType", "_NG-TTL", "Tenant", "Region", "Seq", "QBridge.Source", "NGinn.Label",
         "NGinn.FromEndpoint", "NServiceBus.MessageId", "NServiceBus.OriginatingEndpoint", "NServiceBus.ReplyToAddress",
         " Spaced ", ""]
TEXT = st.one_of(st.text(alphabet=st.sampled_from(list('ab /\\"\'=|:.,-_{}$é日\xa0\u2028\t\n\r\x7f\x1f')), max_size=12),
                 st.sampled_from(["zażółć", "x" * 30, " padded ", "a\x85b"]))
REPLIES = st.sampled_from(["sql://db/Replies", "sql://db/Sender", "sql://db/MQueue1", "not-an-endpoint", "", " sql://db/X "])
# Local times around Warsaw's clock changes of 2026 (02:00-03:00 on 29 March does not exist,
# 02:00-03:00 on 25 October comes twice) and an ordinary day.
TIMES = st.sampled_from([datetime(2026, 3, 29, 1, 59, 59, 999999), datetime(2026, 3, 29, 2, 30),
                         datetime(2026, 3, 29, 3, 0), datetime(2026, 10, 25, 2, 30), datetime(2026, 10, 25, 3, 0, 0, 1),
                         datetime(2026, 7, 1, 12, 0, 0, 123456), datetime(2026, 1, 1, 0, 0), datetime(2040, 7, 1, 12, 0),
                         datetime(999, 6, 1, 12, 0), datetime(1, 1, 1, 0, 30)])
ERRORS = st.sampled_from([None, "", "   ", "System.Exception: boom\r\n   at X.Y()",
                          "System.InvalidOperationException: outer ---> System.IO.IOException: inner\r\n   at A.B()",
                          "the disk was full\nsecond line", "System.Exception: tab\there\r\n   at X()",
                          "System.Exception: bell\x07\r\n   at X()", "System.Exception: " + "long " * 3300,
                          'System.Exception: "quoted" / slashed \\ back'])


@st.composite
def headers(draw: Any) -> str | None:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.none(), TEXT))  # anything at all
    pairs = []
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(NAMES))
        if name == "_NG-ReplyTo":
            value = draw(REPLIES)
        elif name == "_NG-TTL":
            value = draw(st.sampled_from(["2099-01-01 00:00:00", "2000-01-01 00:00:00", "soon"]))
        elif name == "_NG_MsgType":
            value = draw(st.sampled_from(["Orders.FromHeader, Orders", "Unknown.Type, X", ""]))
        else:
            value = draw(TEXT)
        pairs.append(f"{name}={value}")
    return "|".join(pairs)


@st.composite
def body(draw: Any) -> str:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from(["[1, 2]", "{bad", '{"$type": 5}', '{"$type": ""}', '{"$type": null}', "", "null", '"x"']))
    fields = {"Note": draw(TEXT), "N": draw(st.integers(-2**63, 2**63 - 1))}
    if kind > 2:
        fields["$type"] = draw(st.sampled_from(["Orders.PlaceOrder, Orders", "Shop.Messages.OrderPlaced, Shop.Messages",
                                                "Unknown.Type, Nowhere"]))
        return json.dumps({"$type": fields.pop("$type"), **fields})
    return nginn_body("Orders.PlaceOrder, Orders", **fields) if kind == 1 else json.dumps(fields)


@st.composite
def nginn_rows(draw: Any) -> list[dict[str, Any]]:
    rows = []
    for n in range(draw(st.integers(1, 24))):
        sent = draw(TIMES)
        rows.append({
            "from_endpoint": draw(st.sampled_from(["sql://db/Sender", "", "sql://db/Other"])),
            "to_endpoint": draw(st.sampled_from(["sql://db/MQueue1", "sql://db/Billing", "msmq://elsewhere/Q", ""])),
            "subqueue": draw(st.sampled_from("IIIIRXFFZ")),
            "insert_time": sent,
            "last_processed": draw(st.one_of(st.none(), TIMES)),
            "retry_count": draw(st.integers(-1, 4)),
            "retry_time": draw(st.one_of(TIMES, st.just(sent + timedelta(hours=1)))),
            "error_info": draw(ERRORS),
            "correlation_id": draw(st.one_of(st.none(), st.just(""), TEXT)),
            "label": draw(st.one_of(st.none(), st.just(""), TEXT)),
            "msg_text": draw(body()),
            "msg_headers": draw(headers()),
            "unique_id": draw(st.one_of(st.none(), st.just(""), st.text("0123456789abcdef", min_size=1, max_size=8))),
        })
    return rows


def written(outs: list[Any], places: list[int]) -> list[tuple[Any, ...]]:
    """Every transport row a batch writes, in batch order: (place, kind, queue, header JSON, body,
    expiry, due)."""
    if len(outs) == 1 and isinstance(outs[0], LaneBatch):
        lane = outs[0]
        found = [(int(t.positions[i]), t.kind, t.queue, t.headers[i].as_py(), t.bodies[i].as_py(), t.expires,
                  t.due[i].as_py() if t.due is not None else None) for t in lane.tables for i in range(len(t.positions))]
        found += [(at, o.kind, o.queue, _json(o.headers), o.body, o.expires, o.due) for at, o in lane.outs]
        return sorted(found, key=lambda r: r[0])
    return [(at, o.kind, o.queue, _json(o.headers), o.body, o.expires, o.due) for at, o in zip(places, outs)]


def _json(headers: dict[str, str]) -> str:
    """The header JSON a row is written with; for a value no encoder takes (a lone surrogate,
    which the write then quarantines: pipeline/refusals.py), the headers as they are."""
    try:
        return headers_json(headers)
    except TypeError:
        return repr(headers)


def lane_outs(b: Bridge) -> list[Any]:
    """What a batch of the queue's rows (up to 1,000) writes when the columnar lane takes every
    batch it can (lane_min_rows 1): its one LaneBatch, or the per-row lanes' rows."""
    runner = b.runner()
    runner.lane_min_rows = 1
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    return runner._settle(None, source, rows, False, PassStats("MQueue1"), {})[0]


def both_lanes(b: Bridge, lock: bool) -> tuple[Any, Any]:
    """(columnar lane, per-row lanes) over the queue's rows: rows written, ledger entries,
    quarantine, consumes and counts."""
    runner = b.runner()
    runner.lane_min_rows = 1
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    results = []
    for columnar in (True, False):
        stats = PassStats("MQueue1")
        copies = [r._replace(values=dict(r.values)) for r in rows]
        places: list[int] = []
        if columnar:  # the batch as the fetch gives it (bridge.sources.fetched), read again
            with runner.source_engine.connect() as conn:
                fetched = source.fetch_after(conn, None, 1000, False)
            outs, entries, quarantined, consume = runner._settle(None, source, fetched, lock, stats, {}, places)
        else:
            outs, entries, quarantined, consume = runner._process(None, source, copies, lock, stats, {}, places)
        results.append((written(outs, places), sorted(entries), sorted((q.message_id, q.source_key, q.reason, str(q.raw))
                                                                        for q in quarantined),
                        sorted(consume), (stats.delivered, stats.skipped, stats.quarantined, stats.already),
                        stats.lag_seconds is not None))
    return results[0], results[1]


@pytest.mark.parametrize("mapping", list(MAPPINGS))
@pytest.mark.parametrize("lock", [False, True], ids=["copy", "move"])
def test_the_columnar_lane_and_the_per_row_lanes_agree_on_the_corpus(tmp_path: Path, mapping: str, lock: bool) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mapping=MAPPINGS[mapping])
    assert b.cli("init") == 0
    b.insert(corpus(b.now_local()) * 3)  # more rows than one of each: groups of several rows
    columnar, per_row = both_lanes(b, lock)
    assert columnar == per_row


def test_the_columnar_lane_takes_the_common_rows(tmp_path: Path) -> None:
    """Not vacuous: under the test mapping the lane itself writes the ordinary rows of every state."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    b.insert(corpus(b.now_local()) * 3)
    lane = lane_outs(b)[0]
    kinds = {(t.kind, t.queue) for t in lane.tables}
    assert {("queue", "Orders"), ("delayed", "Orders"), ("queue", "error")} <= kinds
    by_lane = sum(len(t.positions) for t in lane.tables)
    assert by_lane >= 2 * len(lane.outs), (by_lane, len(lane.outs))


@pytest.fixture(scope="module")
def hypothesis_bridges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bridge]:
    made = {}
    for name in ("test mapping", "ready delayed, delayed queued", "failed queued", "only a * route, no templates"):
        tmp = tmp_path_factory.mktemp("lane")
        b = Bridge(tmp, f"sqlite:///{tmp}/legacy.db", f"sqlite:///{tmp}/nsb.db", mapping=MAPPINGS[name])
        assert b.cli("init") == 0
        made[name] = b
    return made


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=nginn_rows(), mapping=st.sampled_from(["test mapping", "ready delayed, delayed queued", "failed queued",
                                                   "only a * route, no templates"]), lock=st.booleans())
def test_the_columnar_lane_and_the_per_row_lanes_agree_on_rows_of_every_shape(
        hypothesis_bridges: dict[str, Bridge], rows: list[dict[str, Any]], mapping: str, lock: bool) -> None:
    b = hypothesis_bridges[mapping]
    with b.source.begin() as conn:
        conn.execute(b.tables["MQueue1"].delete())
    b.insert(rows)
    columnar, per_row = both_lanes(b, lock)
    assert columnar == per_row


@pytest.mark.parametrize("db", ["postgres", "sqlite", "postgres-sqlserver-flavor"])
def test_a_sync_writes_the_same_tables_with_and_without_the_lane(db: str, tmp_path: Path, request: Any) -> None:
    """Through the real write: COPY BINARY encoded from Arrow on PostgreSQL, executemany on
    SQLite and into SQL Server-shaped tables; the same rows in each table in the same order, the
    same ledger and the same books."""
    tables = {}
    now = datetime.now().replace(microsecond=0)
    for columnar in (True, False):
        d = tmp_path / str(columnar)
        d.mkdir()
        if db.startswith("postgres"):
            pg, schema = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_schema")
            with sa.create_engine(pg).begin() as conn:  # one schema, made afresh: the reply addresses name it
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
                conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
            b = Bridge(d, pg, pg, source_schema=schema, target_schema=schema,
                       flavor="sqlserver" if db.endswith("sqlserver-flavor") else "postgresql")
        else:
            b = Bridge(d, f"sqlite:///{d}/legacy.db", f"sqlite:///{d}/nsb.db")
        assert b.cli("init") == 0
        b.insert(corpus(now) * 40)
        runner = b.runner()
        runner.columnar = columnar
        runner.run_range("MQueue1", 0, 10_000)
        tables[columnar] = {t: transport_rows(b, t) for t in ("Orders", "Orders.Delayed", "error")}
        assert b.cli("verify") == 0
    assert tables[True] == tables[False]
    assert len(tables[True]["Orders"]) > 500


def transport_rows(b: Bridge, table: str) -> list[tuple[Any, ...]]:
    """A transport table's rows as written: header text, body, expiry, due; in `seq` order where
    the table numbers its rows, else sorted."""
    with b.target.connect() as conn:
        t = sa.Table(table, sa.MetaData(), schema=b.target_schema, autoload_with=conn)
        names = {c.name.lower(): c for c in t.c}
        seq = names.get("seq")
        picked = [names[n] for n in ("headers", "body", "expires", "due") if n in names]
        found = [tuple(r) for r in conn.execute(sa.select(*picked).order_by(*([seq] if seq is not None else [])))]
    return found if seq is not None else sorted(found, key=repr)


def test_the_lane_leaves_out_every_character_str_strip_would_strip_but_the_space() -> None:
    """The lane trims only spaces; a row holding any other character str.strip() strips (a
    no-break space, an ideographic space) is left to the per-row lane, which strips it."""
    import sys

    import pyarrow as pa
    import pyarrow.compute as pc

    from bridge.sources.nginn_lane import _ODD, WHITESPACE

    assert set(WHITESPACE) == {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()}
    odd = [c for c in WHITESPACE if c != " "]
    assert pc.all(pc.match_substring_regex(pa.array([f"Tenant=a{c}" for c in odd]), _ODD)).as_py()
    assert not pc.any(pc.match_substring_regex(pa.array(["Tenant = a b ", "Uni=zażółć 日本", "x=\u200b"]), _ODD)).as_py()
