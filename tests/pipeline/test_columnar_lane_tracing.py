"""With tracing on, the columnar lane and the per-row lanes write the same header text (issue 45,
finding 2): whether a message has its own `traceparent` is decided on the parsed header names,
never on the JSON text, where a legacy header named `x"traceparent` reads `"x\\"traceparent":`.
Before the fix the lane overwrote that header's value with the batch's traceparent and added none;
the per-row lanes kept it and added `traceparent`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import tracing
from bridge.pipeline.loop import PassStats
from helpers import Bridge
from tests.pipeline.test_columnar_lane import nginn_rows
from tests.systems.test_fast_lane import MAPPINGS

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
NAMES = ["traceparent", 'x"traceparent', 'traceparent"', "Traceparent", "a,traceparent", "{traceparent", "x\\"]
VALUES = [GOOD, "junk", 'with "quotes" and , comma', "00-" + "0" * 32 + "-00f067aa0ba902b7-01", ""]


@st.composite
def traced_rows(draw: Any) -> list[dict[str, Any]]:
    rows = draw(nginn_rows())
    for row in rows:
        extra = [f"{draw(st.sampled_from(NAMES))}={draw(st.sampled_from(VALUES))}" for _ in range(draw(st.integers(0, 3)))]
        if extra and draw(st.booleans()):
            row["msg_headers"] = "|".join([*extra, *([row["msg_headers"]] if row["msg_headers"] else [])])
    return rows


@pytest.fixture(scope="module")
def bridges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bridge]:
    made = {}
    for name in ("test mapping", "only a * route, no templates"):
        tmp = tmp_path_factory.mktemp("traced")
        b = Bridge(tmp, f"sqlite:///{tmp}/legacy.db", f"sqlite:///{tmp}/nsb.db", mapping=MAPPINGS[name])
        assert b.cli("init") == 0
        made[name] = b
    return made


def written_with_tracing(b: Bridge, columnar: bool) -> dict[str, list[Any]]:
    """What one batch over the queue's rows writes into each transport table, tracing on, read
    back from the real tables (the transaction is rolled back)."""
    runner = b.runner()
    runner.lane_min_rows = 1
    runner.target.writer.trace_messages = True
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    tables = ("Orders", "Orders.Delayed", "error", "Unrouted")
    with runner.target_engine.connect() as tconn:
        tx = tconn.begin()
        stats = PassStats("MQueue1")
        if columnar:
            outs, *_ = runner._settle(tconn, source, rows, False, stats, {})
        else:
            outs, *_ = runner._process(tconn, source, rows, False, stats, {})
        runner.target.write(tconn, outs)
        found = {}
        for t in tables:
            if sa.inspect(tconn).has_table(t):
                order = "id" if t.endswith(".Delayed") else "seq"  # the delayed table numbers rows by id
                found[t] = [r[0] for r in tconn.execute(sa.text(f'select headers from "{t}" order by {order}'))]
        tx.rollback()
    return found


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=traced_rows(), mapping=st.sampled_from(["test mapping", "only a * route, no templates"]))
def test_with_tracing_on_both_lanes_write_the_same_headers(bridges: dict[str, Bridge], rows: list[dict[str, Any]],
                                                           mapping: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "traceparent", lambda: PARENT)
    b = bridges[mapping]
    with b.source.begin() as conn:
        conn.execute(b.tables["MQueue1"].delete())
    b.insert(rows)
    lane, per_row = written_with_tracing(b, True), written_with_tracing(b, False)
    assert lane == per_row
    for texts in lane.values():  # every row carries exactly one traceparent NServiceBus can parse
        for text in texts:
            h = orjson.loads(text)
            assert tracing.valid_traceparent(h["traceparent"]), h


def test_a_header_named_x_quote_traceparent_is_kept_and_traceparent_added(bridges: dict[str, Bridge],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: 70 rows with a legacy header `x"traceparent`, through both lanes."""
    monkeypatch.setattr(tracing, "traceparent", lambda: PARENT)
    b = bridges["test mapping"]
    with b.source.begin() as conn:
        conn.execute(b.tables["MQueue1"].delete())
    b.insert([{**r, "msg_headers": 'Tenant=acme|x"traceparent=keep me'} for r in b.ready(70)])
    for columnar in (True, False):
        [texts] = [v for k, v in written_with_tracing(b, columnar).items() if k == "Orders"]
        assert len(texts) == 70
        for text in texts:
            h = orjson.loads(text)
            assert (h['x"traceparent'], h["traceparent"]) == ("keep me", PARENT), (columnar, h)


def test_the_patterns_find_the_name_and_only_the_name() -> None:
    import re

    for headers in ({"traceparent": GOOD}, {"a": "b", "traceparent": "junk"}, {'x"traceparent': GOOD},
                    {"v": ',"traceparent":"' + GOOD + '"'}, {"x\\": "y", "traceparent": GOOD}):
        text = orjson.dumps(headers).decode()
        named = "traceparent" in headers
        assert bool(re.search(tracing.TRACEPARENT_JSON_ANY, text)) == named, text
        kept = bool(re.search(tracing.TRACEPARENT_JSON_VALID, text))
        assert kept == (named and tracing.valid_traceparent(headers["traceparent"])), text
        if named:
            assert orjson.loads(re.sub(tracing.TRACEPARENT_JSON_ANY, r'\1"traceparent":"X"', text)) == {**headers, "traceparent": "X"}
