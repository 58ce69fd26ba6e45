"""Mapping rules (issue 47) give the same rows whichever lane maps a message: for random rule sets
over NGinn rows of every shape, the fast lane (plain_envelope), the validated path (envelope) and,
where the rules allow it (type rules alone), the columnar lane write the same transport rows —
headers byte for byte, bodies, tables, order — the same ledger entries, skips and quarantine."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.pipeline.loop import PassStats
from helpers import MAPPING, Bridge
from tests.pipeline.test_columnar_lane import both_lanes, lane_outs, nginn_rows, written

RULES = {
    "type rule": "[[types.rules]]\nmatch = '^Orders\\.(\\w+), Orders$'\nto = 'Shop.\\1, Shop'\n",
    "type chain": "[[types.rules]]\nmatch = '^(\\w+)\\.(\\w+), \\1$'\nto = ['N.\\2, N', 'N.IEvent, N']\n",
    "route by header": "[[routes.rules]]\nwhen = '\"Tenant\" in headers && headers[\"Tenant\"].startsWith(\"a\")'\nto = 'Billing'\n",
    "route by body": "[[routes.rules]]\nwhen = 'has(body.N) && body.N > 0'\nto = 'Billing'\n",
    "skip by header": "[[skip]]\nname = 'regional'\nwhen = '\"Region\" in headers'\n",
    "skip by state": "[[skip]]\nname = 'failed ones'\nwhen = 'state == \"failed\"'\n",
    "body ops": ("[[body]]\nwhen = 'type.startsWith(\"Orders.\")'\nstrip_types = true\nrename = { 'Note' = 'Remark' }\n"
                 "delete = ['Lines']\nset = { 'V' = 2, 'Meta.By' = 'qbridge' }\n"),
    "header ops": ("[[headers.rules]]\nwhen = 'queue == \"MQueue1\"'\nset = { 'Acme.Q' = '{queue}/{state}' }\n"
                   "from_body = { 'Acme.Note' = 'Note' }\nreplace = { 'NServiceBus.ReplyToAddress' = ['^(.*)$', 'x-\\1'] }\n"
                   "drop = ['Tenant']\n"),
    "ttbr none": "[[ttbr]]\nwhen = 'true'\nset = 'none'\n",
    "ttbr by header": "[[ttbr]]\nwhen = '\"Tenant\" in headers'\nset = '00:10:00'\n",
    "route by kernels": ("[[routes.rules]]\nwhen = '!(headers[\"Region\"] in [\"eu\", \"us\"]) && headers.Region.matches(\"^e.\") "
                         "|| headers[\"Tenant\"] < \"b\" && queue.endsWith(\"1\")'\nto = 'Sales'\n"),
}


def _mapping(chosen: list[str]) -> str:
    return MAPPING + "".join(RULES[name] for name in chosen)


def both_per_row_lanes(b: Bridge, lock: bool) -> tuple[Any, Any]:
    """(fast lane, validated path) over the queue's rows."""
    runner = b.runner()
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    results = []
    for fast in (True, False):
        runner.fast_lane = fast
        stats = PassStats("MQueue1")
        copies = [r._replace(values=dict(r.values)) for r in rows]
        places: list[int] = []
        outs, entries, quarantined, consume = runner._process(None, source, copies, lock, stats, {}, places)
        results.append((written(outs, places), sorted(entries), sorted((q.message_id, q.source_key, q.reason) for q in quarantined),
                        sorted(consume), (stats.delivered, stats.skipped, stats.quarantined)))
    return results[0], results[1]


@pytest.fixture(autouse=True)
def _one_clock_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """A [[ttbr]] rule's expiry is the clock's now + its span: one reading for every lane, so the
    lanes' rows compare whole."""
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    monkeypatch.setattr("bridge.targets.reshape.utcnow", lambda: now)


@pytest.fixture(scope="module")
def rule_bridges(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], Bridge]:
    return {}


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=nginn_rows(), chosen=st.lists(st.sampled_from(sorted(RULES)), unique=True, max_size=5), lock=st.booleans())
def test_rules_give_the_same_rows_in_every_lane(rule_bridges: dict[tuple[str, ...], Bridge], tmp_path_factory: pytest.TempPathFactory,
                                                rows: list[dict[str, Any]], chosen: list[str], lock: bool) -> None:
    key = tuple(sorted(chosen))
    b = rule_bridges.get(key)
    if b is None:
        tmp = tmp_path_factory.mktemp("rules")
        b = rule_bridges[key] = Bridge(tmp, f"sqlite:///{tmp}/legacy.db", f"sqlite:///{tmp}/nsb.db", mapping=_mapping(chosen))
        assert b.cli("init") == 0
    with b.source.begin() as conn:
        conn.execute(b.tables["MQueue1"].delete())
    b.insert(rows)
    fast, validated = both_per_row_lanes(b, lock)
    assert fast == validated
    columnar, per_row = both_lanes(b, lock)
    assert columnar == per_row


def test_the_rules_are_not_vacuous_here(tmp_path: Path) -> None:
    """Every rule of the pool applies to some row of the corpus the property test draws from."""
    from tests.systems.test_fast_lane import corpus

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mapping=_mapping(sorted(RULES)))
    assert b.cli("init") == 0
    b.insert(corpus(b.now_local()) * 2)
    fast, validated = both_per_row_lanes(b, False)
    assert fast == validated
    assert fast[4][0] > 0 and fast[4][1] > 0  # some delivered, some skipped by the rules


@pytest.mark.parametrize("chosen", [["skip by state", "skip by header", "type rule", "type chain"], sorted(RULES),
                                    ["header ops", "route by header", "ttbr by header", "ttbr none", "route by kernels"]],
                         ids=["group rules", "every rule", "header rules"])
def test_rules_keep_the_columnar_lane(tmp_path: Path, chosen: list[str]) -> None:
    """Rules leave the queue on the lane: skips by state or by a header's presence and type rules
    are decided by each group's example; routes and skips by header values, body operations and
    header rules split the groups by what they hold of each row (bridge.targets.lane_rules). The
    lane writes rows itself, and the same rows as the per-row lanes."""
    from tests.systems.test_fast_lane import corpus

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mapping=_mapping(chosen))
    assert b.cli("init") == 0
    rows = corpus(b.now_local()) * 3
    for i, row in enumerate(rows):  # a Note in some bodies, for from_body and rename
        try:
            doc = orjson.loads(row.get("msg_text") or "")
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and i % 2:
            rows[i] = {**row, "msg_text": orjson.dumps({**doc, "Note": f"note {i}"}).decode()}
    b.insert(rows)
    lane = lane_outs(b)[0].tables
    assert sum(len(t.positions) for t in lane) > 0  # the lane wrote rows itself
    headers = [t.headers[i].as_py() for t in lane for i in range(len(t.positions))]
    bodies = [t.bodies[i].as_py() or b"" for t in lane for i in range(len(t.positions))]
    if "header ops" in chosen:  # and rows the rules changed: a header from the body (unless renamed first)
        assert any('"Acme.Q":"MQueue1' in h for h in headers)
        assert any('"Acme.Note":"note ' in h for h in headers) == ("body ops" not in chosen)
    if "body ops" in chosen:
        assert any(b'"Remark":"note ' in b and b'"V":2' in b for b in bodies)
    if "route by header" in chosen:
        assert any(t.queue == "Billing" for t in lane)
    if "ttbr by header" in chosen:
        assert any(t.expires is not None for t in lane) and any(t.expires is None for t in lane)
        assert any('"NServiceBus.TimeToBeReceived":"00:10:00"' in h for h in headers)
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row
