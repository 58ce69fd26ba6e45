"""Fresh-eyes review of "rules keep the columnar lane" (0b79d81, 23eb7d6, b2f8168): the lane
(bridge/targets/lane_rules.py, when_columns.py, envelope_columns.py, pipeline/columnar.py) against
the per-row lanes (plain_envelope / envelope row by row) and against CEL itself.

FINDINGS (each test failed before its fix; fixed: a replace on a stand-in time gives the group back,
`type` after a `.` is a field and keeps its name, the header pool's offsets are fixed in two passes):

1. `test_finding_replace_on_a_time_header_writes_the_examples_stand_in`
   A `[[headers.rules]] replace` over NServiceBus.TimeSent / DeliverAt / TimeOfFailure runs on the
   group example, whose time is the stand-in text "0001-01-01 00:00:00:00000x Z" (columns.SENT,
   DUE, FAILED), a real text without a NUL, so GiveBack does not fire. The regex rewrites the
   stand-in; the template then no longer holds it, so every lane row is written with the
   stand-in's year 1 (or the pattern's replacement of it) instead of its own time. The per-row
   lanes write the row's own time. HIGH: wrong bytes in the transport table for every row.
   `test_finding_replace_over_a_time_copied_by_a_template_writes_the_stand_in`: the same through
   a `set` template `{header:NServiceBus.TimeSent}` followed by a replace on the copy.
   `test_finding_verify_deep_flags_what_the_lane_wrote_for_a_time_replace` shows the consequence
   on a real sync on PostgreSQL (lane on, 100 rows): `verify --deep` mismatches all 100 messages.

2. `test_finding_headers_dot_type_kernel_disagrees_with_cel` and
   `test_finding_headers_dot_type_routes_differently_by_lane`
   `headers.type` (a header named "type" by field selection) is spelled `headers._typ` by
   mapping_rules._spelled before CEL compiles it (its regex replaces every `type` that is not a
   call), so CEL looks up a header "_typ" (absent: error: no match). The Arrow kernel reads the
   header "type". Kernel and CEL disagree; a route/skip rule on `headers.type` sends the lane's
   rows to another queue (or skips them) than the per-row lanes, replay and `verify --deep` do.
   MEDIUM-HIGH (different table/ledger entry for the same message depending on batch size).

3. `test_finding_latent_header_column_text_then_column_misindexes` (LATENT, LOW)
   lane_rules._Headers.column: a "text" constant is indexed at `size + len(constants) - 1`, but
   `size` grows when a LATER group's spec is a "column" marker (its pool is appended after the
   constant's index was taken). A header that is real text in one group and a value column in a
   later group reads another row's column value instead of the constant. Not reachable by NGinn or
   the plain lane today (no header name is "text" in one group and "column" in another), so it is
   pinned at unit level with hand-made PlainColumns.

PASSING GUARDS (sound behaviour checked, kept as regression pins): marked `test_guard_...`:
contextvars reset after GiveBack; a body rule's table value not leaking between rows/batches (and
the mapping's own value intact); kernels == CEL on line breaks and Unicode; the OpenJMS lane with
every rule kind; the BizTalk lane with xml keep/json rules.
"""

from __future__ import annotations

import contextlib
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from bridge.demo.samples import nginn_row
from bridge.mapping_rules import FORCED, MessageFacts, When
from bridge.targets.reshape import EXAMPLE
from bridge.targets.when_columns import Rows, kernel
from helpers import MAPPING, Bridge
from tests.pipeline.test_columnar_lane import both_lanes, lane_outs

NOW = datetime(2026, 7, 1, 12, 0)


@pytest.fixture(autouse=True)
def _one_clock_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """A [[ttbr]] expiry is now + span: one clock reading for both lanes (as test_rules_lanes)."""
    fixed = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    monkeypatch.setattr("bridge.targets.reshape.utcnow", lambda: fixed)


def _bridge(tmp: Path, rules: str, db: str = "sqlite") -> Bridge:
    b = Bridge(tmp, f"sqlite:///{tmp}/legacy.db", f"sqlite:///{tmp}/nsb.db", mapping=MAPPING + rules)
    with contextlib.redirect_stdout(io.StringIO()):
        assert b.cli("init") == 0
    return b


def _lane_wrote(b: Bridge) -> int:
    """How many rows the columnar lane itself wrote or skipped (not given back)."""
    outs = lane_outs(b)
    return sum(len(t.positions) for t in getattr(outs[0], "tables", [])) if outs else 0


def _first_diff(columnar: Any, per_row: Any) -> str:
    for part, (x, y) in enumerate(zip(columnar, per_row)):
        if x != y:
            if isinstance(x, list):
                for a, c in zip(x, y):
                    if a != c:
                        return f"part {part}:\n lane:    {a}\n per-row: {c}"
            return f"part {part}:\n lane:    {x}\n per-row: {y}"
    return ""


# -- 1. replace over a time header: the example's stand-in is rewritten ----------------------------

@pytest.mark.parametrize("header,subqueue", [("NServiceBus.TimeSent", "I"), ("NServiceBus.DeliverAt", "R"),
                                             ("NServiceBus.TimeOfFailure", "F")])
def test_finding_replace_on_a_time_header_writes_the_examples_stand_in(tmp_path: Path, header: str, subqueue: str) -> None:
    """FINDING 1 (high). Reproduce: a mapping with
        [[headers.rules]]
        replace = { 'NServiceBus.TimeSent' = ['^(\\d{4}).*$', 'year \\1'] }
    and a few ordinary NGinn rows. The per-row lanes write "year 2026"; the columnar lane runs the
    replace on its example's stand-in time "0001-01-01 00:00:00:000001 Z" (bridge.sources.columns
    SENT; DUE and FAILED likewise), which holds no NUL so reshape does not GiveBack, and writes
    "year 0001" for every row of the group. Same for DeliverAt (delayed) and TimeOfFailure (failed).
    Fix idea: give back (or treat as a marker) any header whose value holds a stand-in's wire text
    when a replace touches it."""
    rules = f"[[headers.rules]]\nreplace = {{ '{header}' = ['^(\\d{{4}}).*$', 'year \\1'] }}\n"
    b = _bridge(tmp_path, rules)
    extra: dict[str, Any] = {}
    if subqueue == "R":
        extra["retry_time"] = NOW + timedelta(hours=1)
    if subqueue == "F":
        extra["error_info"] = "System.Exception: boom\r\n   at X.Y()"
    b.insert([nginn_row("MQueue1", i, NOW, subqueue=subqueue, headers="Tenant=a", **extra) for i in range(1, 4)])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row, _first_diff(columnar, per_row)


def test_finding_replace_over_a_time_copied_by_a_template_writes_the_stand_in(tmp_path: Path) -> None:
    """FINDING 1, second shape (found by a hypothesis run over a wider rule pool). Reproduce:
        [[headers.rules]]
        set = { 'Acme.D' = '{state}|{header:NServiceBus.TimeSent}' }
        replace = { 'Acme.D' = [' ', '_'] }
    The set copies the stand-in text into Acme.D (fine on its own: the template swaps it back),
    but the replace then rewrites it ("0001-01-01_00:00:00:000001_Z"), which the template no
    longer recognises: the lane writes year 1 into Acme.D, the per-row lanes the row's time."""
    rules = ("[[headers.rules]]\nset = { 'Acme.D' = '{state}|{header:NServiceBus.TimeSent}' }\n"
             "replace = { 'Acme.D' = [' ', '_'] }\n")
    b = _bridge(tmp_path, rules)
    b.insert([nginn_row("MQueue1", i, NOW, headers="Tenant=a") for i in range(1, 4)])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row, _first_diff(columnar, per_row)


@pytest.mark.postgres
def test_finding_verify_deep_flags_what_the_lane_wrote_for_a_time_replace(tmp_path: Path, pg_server: str,
                                                                          pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """FINDING 1, end to end on PostgreSQL. Reproduce: 100 ready NGinn rows, the mapping's
    `replace` over NServiceBus.TimeSent, `qbridge sync --once` (the lane takes batches of 64+
    rows), then `qbridge verify --deep`. The lane wrote "0001" where the source row makes "2026":
    every message mismatches (verify's envelope is the per-row one)."""
    import sqlalchemy as sa

    from bridge.sources.nginn import NGinnSource

    monkeypatch.setattr(NGinnSource, "lane_min_rows", 64)  # these 100 rows: under NGinn's own threshold

    with sa.create_engine(pg_server).begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE'))
        conn.execute(sa.text(f'CREATE SCHEMA "{pg_schema}"'))
    rules = "[[headers.rules]]\nreplace = { 'NServiceBus.TimeSent' = ['^(\\d{4})-', '\\1/'] }\n"
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, mapping=MAPPING + rules)
    with contextlib.redirect_stdout(io.StringIO()):
        assert b.cli("init") == 0
    b.insert([nginn_row("MQueue1", i, NOW, headers="Tenant=a") for i in range(1, 101)])
    with contextlib.redirect_stdout(io.StringIO()):
        assert b.cli("sync", "--once") == 0
    sent = {r["headers"]["NServiceBus.TimeSent"][:5] for r in b.rows("Orders")}
    assert len(b.rows("Orders")) == 100
    from bridge.lifecycle.verify_deep import deep_compare

    books = deep_compare(b.runner())["MQueue1"]
    assert books.mismatched == 0 and books.matched == 100, books  # the lane's rows: all 100 mismatch
    assert sent == {"2026/"}, sent  # what the per-row lanes write; the lane wrote "0001/"


# -- 2. headers.type: kernel vs CEL ---------------------------------------------------------------

def test_finding_headers_dot_type_kernel_disagrees_with_cel() -> None:
    """FINDING 2. Reproduce: When('headers.type == "x"').evaluate(...) over headers {"type": "x"}
    is False (mapping_rules._spelled rewrites the expression to `headers._typ == "x"`, a key the
    message lacks: an error value), while when_columns.kernel of the same text reads header
    "type" and says True. The module promises the kernel "is never a second CEL"."""
    expression = 'headers.type == "x"'
    when = When(expression)
    headers = {"type": "x"}
    cel = when.evaluate(MessageFacts("nginn", "MQueue1", "MQueue1", "ready", "T", headers, None))
    run = kernel(expression)
    assert run is not None
    got = run(Rows({k: pa.array(["v"], pa.string()) for k in ("system", "queue", "destination", "state", "type")},
                   lambda name: pa.array([headers.get(name)], pa.string()), 1)).tolist()
    assert got == [cel], (got, cel)


def test_finding_headers_dot_type_routes_differently_by_lane(tmp_path: Path) -> None:
    """FINDING 2, on the write. Reproduce: `[[routes.rules]] when = 'headers.type == "x"'
    to = 'Billing'` and NGinn rows with the legacy header `type=x`. The lane's kernel routes them
    to Billing; the per-row lanes (CEL: headers._typ, absent) route them to Orders. The same
    message lands in a different table (and ledger target) by whether its batch took the lane."""
    b = _bridge(tmp_path, "[[routes.rules]]\nwhen = 'headers.type == \"x\"'\nto = 'Billing'\n")
    b.insert([nginn_row("MQueue1", i, NOW, headers="type=x") for i in range(1, 4)])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row, _first_diff(columnar, per_row)


# -- 3. latent: a text constant indexed before a later group's column pool ------------------------

def test_finding_latent_header_column_text_then_column_misindexes() -> None:
    """FINDING 3 (latent, low). lane_rules._Headers.column gives a group whose example holds the
    header's real text the index `size + len(constants) - 1` at that moment; a later group whose
    example holds a value-column marker for the same name appends that column to the pool and
    grows `size`, so the constant's index now points into the column. Reproduce with hand-made
    PlainColumns: group 0's example has H = "real", group 1's has H = marker of column "key"; the
    rows of group 0 read a key instead of "real"."""
    from bridge.model import PlainMessage
    from bridge.sources.columns import PlainColumns, mark
    from bridge.targets.lane_rules import _Headers

    def ex(value: str) -> PlainMessage:
        return PlainMessage("ready", mark("mid"), "nginn", "db", "q", mark("key"), "q", None, None, [], None,
                            datetime(2026, 1, 1, tzinfo=UTC), None, {"H": value}, b"")

    cols = PlainColumns(positions=np.arange(3), groups=np.array([0, 1, 1]), examples=[ex("real"), ex(mark("key"))],
                        values={"key": pa.array(["k0", "k1", "k2"])}, header_values=pa.array([], pa.string()),
                        header_starts=np.zeros(3, dtype=np.int64), bodies=pa.array([b"{}"] * 3, pa.binary()),
                        sent=pa.array([None] * 3, pa.timestamp("us", "UTC")), due=None, mids=["a", "b", "c"],
                        keys=["k0", "k1", "k2"])
    assert _Headers(cols).column("H").to_pylist() == ["real", "k1", "k2"]


# -- passing guards -------------------------------------------------------------------------------

def test_guard_contextvars_are_reset_after_a_giveback_and_an_error(tmp_path: Path) -> None:
    """PASSING GUARD. A group whose example raises GiveBack (a replace over a marker value) and a
    batch where the lane raises: FORCED and EXAMPLE are None afterwards, and the rows take the
    per-row lanes with the same result."""
    b = _bridge(tmp_path, "[[headers.rules]]\nwhen = 'headers.Tenant == \"a\"'\nreplace = { 'Acme.Tenant' = ['a', 'b'] }\n")
    b.insert([nginn_row("MQueue1", i, NOW, headers="Tenant=a") for i in range(1, 4)])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row
    assert FORCED.get() is None and EXAMPLE.get() is None


def test_guard_body_rules_do_not_leak_between_rows_or_batches(tmp_path: Path) -> None:
    """PASSING GUARD. A body rule sets a table (copied per row since 23eb7d6), a later rule
    changes it in the body; run the lane twice on the same rows and compare with the per-row lanes:
    the mapping's own value and the second batch are untouched by the first."""
    rules = ("[[body]]\nset = { 'Meta' = { 'Tags' = ['a'] } }\n"
             "[[body]]\nrename = { 'Meta' = 'M' }\nset = { 'M.Tags' = ['b'], 'M.By' = 'x' }\n"
             "[[headers.rules]]\nfrom_body = { 'Acme.By' = 'M.By' }\n")
    b = _bridge(tmp_path, rules)
    b.insert([nginn_row("MQueue1", i, NOW, headers="Tenant=a") for i in range(1, 5)])
    first = both_lanes(b, False)
    second = both_lanes(b, True)
    assert first[0] == first[1] and second[0] == second[1]
    runner = b.runner()
    assert runner.mapping.body[0].set == {"Meta": {"Tags": ["a"]}}
    assert _lane_wrote(b) == 4


def test_guard_kernels_match_cel_on_newlines_and_unicode() -> None:
    """PASSING GUARD. `matches`, startsWith, comparisons over values with line breaks (the plain
    lane lets \\n, \\r and \\t through), non-BMP and combining characters: kernel == CEL."""
    values = ["a\nb", "a\r\nb", "\n", "b\n", "a\u2028b", "é", "e\u0301", "🚀", "", "ß", "K"]
    exprs = ['headers.A.matches("a.b")', 'headers.A.matches("^b")', 'headers.A.matches("(?m)^b")',
             'headers.A.matches("^.$")', 'headers.A.matches("(?i)^k$")', 'headers.A < "e"', 'headers.A >= "\u00e9"',
             'headers.A.startsWith("e")', 'headers.A.endsWith("")', 'headers.A in ["é", "🚀"]', '!(headers.B == "x")',
             'headers.B == "x" || headers.A.contains("b")', 'headers.B == "x" && headers.A == "zz"']
    for expression in exprs:
        when, run = When(expression), kernel(expression)
        assert run is not None, expression
        got = run(Rows({}, lambda name: pa.array([{"A": v}.get(name) for v in values], pa.string()), len(values))).tolist()
        want = [when.evaluate(MessageFacts("s", "q", "d", "ready", "t", {"A": v}, None)) for v in values]
        assert got == want, expression


def test_guard_openjms_lane_with_rules_agrees(tmp_path: Path) -> None:
    """PASSING GUARD. The plain lane (OpenJMS) with kernel routes, per-group skips, a body rule,
    from_body, a replace over a header the group shares and a TTBR: lane == per-row lanes, and the lane
    itself writes rows. (A hypothesis run of 200 random rule sets over the decoded-lane strategy
    held too.)"""
    from bridge.codecs.openjms_blob import JmsMessage
    from bridge.codecs.openjms_encode import encode
    from bridge.demo.samples import openjms_message
    from tests.pipeline.test_columnar_lane_decoded import jms_rows, lanes
    from tests.systems.test_openjms_source import MAPPING as JMS_MAPPING
    from tests.systems.test_openjms_source import QUEUE_ID, Jms

    rules = ("[[routes.rules]]\nwhen = 'headers.region.startsWith(\"eu\")'\nto = 'Billing'\n"
             "[[skip]]\nname = 'tenant'\nwhen = '\"tenant\" in headers'\n"
             "[[body]]\nwhen = 'has(body.a)'\nset = { 'b' = { 'x' = [1], 'y' = 'k/1' } }\nrename = { 'a' = 'A' }\n"
             "[[headers.rules]]\nfrom_body = { 'Acme.X' = 'b.y', 'Acme.A' = 'A' }\nreplace = { 'NServiceBus.EnclosedMessageTypes' = ['^(.)', 'x\\\\1'] }\n"
             "[[ttbr]]\nwhen = 'headers.region < \"m\"'\nset = '00:10:00'\n")
    j = Jms(tmp_path, f"sqlite:///{tmp_path}/jms.db", f"sqlite:///{tmp_path}/nsb.db", system="openjms", queues=["orders"],
            mapping=JMS_MAPPING + rules)
    j.seed()
    with contextlib.redirect_stdout(io.StringIO()):
        assert j.cli("init") == 0
    msgs = []
    for i, (region, text) in enumerate([("eu-west", '{"a": 1}'), ("us", '{"a": "x/y"}'), ("eu", "not json"),
                                        ("zz", '{"b": 2}'), ("us", '{"a": [1]}'), ("eu", '{"a": 1}')] * 2):
        props = {"region": {"type": "java.lang.String", "value": region}}
        if i == 3:
            props["tenant"] = {"type": "java.lang.String", "value": "t"}
        msgs.append(JmsMessage("org.exolab.jms.message.TextMessageImpl", "TextMessage",
                               {"JMSMessageID": f"ID:h-{i}", "JMSCorrelationID": None, "JMSReplyTo": None,
                                "JMSDestination": {"name": "orders", "kind": "queue", "temporary": False, "persistent": True},
                                "JMSType": "Orders.Placed", "JMSDeliveryMode": 2, "JMSPriority": 4,
                                "JMSTimestamp": 1_764_000_000_123 + i, "JMSExpiration": 0, "JMSRedelivered": False},
                               props, {"text": text}))
    j.store(lambda c, t: [openjms_message(c, t, f"ID:h-{i}", QUEUE_ID, encode(m), [QUEUE_ID * 100]) for i, m in enumerate(msgs)])
    runner, rows = jms_rows(j, "orders")
    columnar, per_row, by_lane = lanes(runner, "orders", rows, False)
    assert columnar == per_row, _first_diff(columnar, per_row)
    assert by_lane >= 6, (by_lane, len(rows), columnar[1:])


def test_guard_biztalk_lane_with_xml_rules_agrees(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """PASSING GUARD. BizTalk (plain lane) with `xml = "keep"` for some messages and `xml = "json"`
    for others (which the lane gives back: the per-row lanes convert), plus a header rule: the
    lane agrees with the per-row lanes."""
    from datetime import datetime as dt

    from tests.pipeline.test_columnar_lane_decoded import lanes
    from tests.systems.test_biztalk_source import MAPPING as BT_MAPPING
    from tests.systems.test_biztalk_source import SMALL, fx, make_bt

    rules = ("[[body]]\nwhen = 'state == \"failed\"'\nxml = 'keep'\n"
             "[[body]]\nwhen = 'state == \"ready\"'\nxml = 'json'\n"
             "[[headers.rules]]\nwhen = '\"BTS.ReceivePortName\" in headers'\nset = { 'Acme.P' = '{header:BTS.ReceivePortName}' }\n")
    for bt in make_bt("sqlite", request, tmp_path, mapping=BT_MAPPING + rules):
        for i in range(3):
            bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL], when=dt(2024, 3, 14, 9, 26, i))
        for i in range(3):
            bt.publish(context=fx("ctx_suspended.bin"), parts=[SMALL], suspended={
                "nState": 4, "dtSuspendTimeStamp": dt(2024, 3, 14, 9, 27, i), "nvcAdapter": "FILE",
                "nvcURI": "D:\\In\\*.xml", "nvcErrorDescription": f"failure {i}", "info": "routing failure"})
        runner = bt.runner()
        source = runner.sources["BizTalkServerApplication"]
        with runner.source_engine.connect() as conn:
            rows = source.fetch_keys(conn, list(source.iter_keys(conn)), False)
        columnar, per_row, by_lane = lanes(runner, "BizTalkServerApplication", rows, False)
        assert columnar == per_row, _first_diff(columnar, per_row)
        assert by_lane == 3, by_lane  # the suspended ones (xml = "keep"); the ready ones are given back
