"""Mapping rules (issue 47) give the same rows whichever lane maps a message: for random rule sets
over NGinn rows of every shape, the fast lane (plain_envelope), the validated path (envelope) and,
where the rules allow it (type rules alone), the columnar lane write the same transport rows —
headers byte for byte, bodies, tables, order — the same ledger entries, skips and quarantine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.pipeline.loop import PassStats
from helpers import MAPPING, Bridge
from tests.pipeline.test_columnar_lane import both_lanes, nginn_rows, written

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
    if not b.runner().mapping.per_message:  # type rules alone: the columnar lane takes the queue too
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


def test_rules_that_read_only_what_a_group_shares_keep_the_columnar_lane(tmp_path: Path) -> None:
    """A skip by state or by a header's presence and type rules leave the queue on the lane: its
    groups' examples decide (a group shares its state, its types and its header names)."""
    from bridge.pipeline.columnar import process_columns
    from tests.systems.test_fast_lane import corpus

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db",
               mapping=_mapping(["skip by state", "skip by header", "type rule", "type chain"]))
    assert b.cli("init") == 0
    b.insert(corpus(b.now_local()) * 3)
    runner = b.runner()
    runner.lane_min_rows = 1
    assert not runner.mapping.per_message
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    outs, *_ = process_columns(runner, None, source, rows, False, PassStats("MQueue1"), {})
    assert sum(len(t.positions) for t in outs[0].tables) > 0  # the lane wrote rows itself
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row
    # a when over the headers' values is per message
    (tmp_path / "b2").mkdir()
    b2 = Bridge(tmp_path / "b2", f"sqlite:///{tmp_path}/l2.db", f"sqlite:///{tmp_path}/n2.db", mapping=_mapping(["route by header"]))
    assert b2.runner().mapping.per_message
