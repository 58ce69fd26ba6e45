"""The columnar lane of the sources that decode row by row (issue 37: "OpenJMS and BizTalk keep
per-row blob decoding, but their header assembly and writes join the lane"): for OpenJMS and
BizTalk the lane (Batch._settle: pipeline/columnar.lane over sources/plain_lane) gives exactly what
the per-row lanes give (the same transport rows with the same header JSON in the same order,
bodies, due times, ledger entries, quarantine, consumes and counts), and takes the common rows.
A property-based test holds it to the per-row lanes on JMS messages of every shape: properties,
correlation ids, types and reply queues with quotes, slashes, control characters, lone surrogates
and any Unicode."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs.openjms_blob import JmsMessage
from bridge.codecs.openjms_encode import encode
from bridge.demo.samples import openjms_message
from bridge.pipeline.columnar import takes_columns
from bridge.pipeline.stats import PassStats
from bridge.sources.plain_lane import plain_columns_of
from tests.pipeline.test_columnar_lane import written
from tests.systems.test_biztalk_source import FRAGMENTED, SMALL, fx, make_bt
from tests.systems.test_fast_lane_openjms import _store
from tests.systems.test_openjms_source import QUEUE_ID, Jms


def lanes(runner: Any, queue: str, rows: list[Any], lock: bool) -> tuple[Any, Any, int]:
    """(columnar lane, per-row lanes, how many rows the lane itself wrote or skipped)."""
    runner.lane_min_rows = 1
    source = runner.sources[queue]
    assert takes_columns(runner, source)
    results, by_lane = [], 0
    for columnar in (True, False):
        stats = PassStats(queue)
        copies = [r._replace(values=dict(r.values)) for r in rows]
        places: list[int] = []
        if columnar:
            outs, entries, quarantined, consume = runner._settle(None, source, copies, lock, stats, {}, places)
            if outs and hasattr(outs[0], "tables"):
                by_lane = sum(len(t.positions) for t in outs[0].tables)
        else:
            outs, entries, quarantined, consume = runner._process(None, source, copies, lock, stats, {}, places)
        results.append((written(outs, places), sorted(entries), sorted((q.message_id, q.source_key, q.reason) for q in quarantined),
                        sorted(consume), (stats.delivered, stats.skipped, stats.quarantined, stats.already)))
    return results[0], results[1], by_lane


def jms_rows(j: Jms, queue: str) -> list[Any]:
    runner = j.runner()
    source = runner.sources[queue]
    with runner.source_engine.connect() as conn:
        return runner, source.fetch_keys(conn, list(source.iter_keys(conn)), False)


@pytest.mark.parametrize("queue,lock", [("orders", False), ("orders", True), ("prices.eu", False)])
def test_openjms_lane_agrees_with_the_per_row_lanes_on_every_fixture(tmp_path: Path, queue: str, lock: bool) -> None:
    j = _store(tmp_path)
    runner, rows = jms_rows(j, queue)
    columnar, per_row, by_lane = lanes(runner, queue, rows, lock)
    assert columnar == per_row
    # Not vacuous: most handles are written by the lane; the expiring, cut-short and odd ones are not.
    assert len(rows) // 2 <= by_lane < len(rows), (by_lane, len(rows))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_biztalk_lane_agrees_with_the_per_row_lanes(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for bt in make_bt(kind, request, tmp_path):
        for i in range(6):
            bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL], when=datetime(2024, 3, 14, 9, 26, i))
        bt.publish(context=fx("ctx_receive.bin"), parts=[FRAGMENTED, ("attachment", [fx("part_small_uncompressed.bin")], 189)])
        bt.publish(context=fx("ctx_receive.bin")[:-7], parts=[SMALL])  # a cut context: quarantined
        for i in range(3):
            bt.publish(context=fx("ctx_suspended.bin"), parts=[SMALL], suspended={
                "nState": 4, "dtSuspendTimeStamp": datetime(2024, 3, 14, 9, 27, i), "nvcAdapter": "FILE",
                "nvcURI": "D:\\BizTalk\\In\\*.xml", "nvcErrorDescription": f"A \"failure\" / {i}\r\n\tDetails...",
                "info": "routing failure"})
        runner = bt.runner()
        source = runner.sources["BizTalkServerApplication"]
        with runner.source_engine.connect() as conn:
            rows = source.fetch_keys(conn, list(source.iter_keys(conn)), False)
        for lock in (False, True):
            columnar, per_row, by_lane = lanes(runner, "BizTalkServerApplication", rows, lock)
            assert columnar == per_row
            assert by_lane == 9, by_lane  # the ready and suspended one-part entries; not the two-part or the cut one
            assert columnar[2] and columnar[0]


def test_a_row_plain_gives_none_or_with_odd_text_is_left_to_the_per_row_lanes() -> None:
    from bridge.model import PlainMessage

    def msg(key: str, header: str) -> PlainMessage:
        return PlainMessage("ready", "m", "openjms", "db", "q", key, "q", None, None, [], None,
                            datetime(2024, 1, 1).astimezone(), None, {"a": header}, b"{}")

    cols = plain_columns_of([(0, None), (1, msg("k1", "ok \t\n\r \\ \" / é")), (2, msg("k2", "bell\x07")),
                             (3, msg("k3", "lone \ud800")), (4, msg("k4", "fine"))])
    assert cols is not None and cols.positions.tolist() == [1, 4] and cols.keys == ["k1", "k4"]
    assert cols.groups.tolist() == [0, 0]  # same shape: one example for both
    assert plain_columns_of([(0, None), (1, msg("k", "\x00"))]) is None


def test_a_batch_judged_whole_takes_the_same_rows_and_groups_as_row_by_row() -> None:
    """The lane judges a batch's text at once and a group's names once; a row that would not pass
    sends the batch to the row-by-row judgment, and a name holding a NUL refuses its group only."""
    from bridge.model import PlainMessage

    def msg(key: str, headers: dict[str, str]) -> PlainMessage:
        return PlainMessage("ready", "m", "openjms", "db", "q", key, "q", None, None, [], None,
                            datetime(2024, 1, 1).astimezone(), None, headers, b"{}")

    rows = [msg("k0", {"a": "x"}), msg("k1", {"b\x00": "x"}), msg("k2", {"c": "y"}), msg("k3", {"b\x00": "z"}),
            msg("k4", {"a": "w"})]
    clean = plain_columns_of(enumerate(rows))
    assert clean is not None and clean.keys == ["k0", "k2", "k4"] and clean.groups.tolist() == [0, 1, 0]
    assert clean.header_values.to_pylist() == ["x", "y", "w"] and clean.header_starts.tolist() == [0, 1, 2]
    odd = plain_columns_of(enumerate([*rows, msg("k5", {"a": "bell\x07"})]))  # judged row by row: the same
    assert odd is not None and odd.keys == clean.keys and odd.groups.tolist() == [0, 1, 0]
    assert odd.header_values.to_pylist() == ["x", "y", "w"] and len(odd.examples) == len(clean.examples) == 2


# -- property-based: JMS messages of every shape --------------------------------------------------
_text = st.text(st.characters(codec="utf-8") | st.sampled_from(list("\"\\/\n\r\t\x00\x07\x1f\u2028é🚀")) | st.just("\ud800"),
                max_size=12)
_prop = st.one_of(st.builds(lambda v: {"type": "java.lang.String", "value": v}, _text),
                  st.builds(lambda v: {"type": "java.lang.Integer", "value": v}, st.integers(-2**31, 2**31 - 1)),
                  st.builds(lambda v: {"type": "java.lang.Boolean", "value": v}, st.booleans()))


@st.composite
def jms_messages(draw: Any) -> list[JmsMessage]:
    out = []
    # Few shapes, so that messages often share a group (and its example) with others that differ
    # only in what the lane fills in row by row.
    for i in range(draw(st.integers(1, 12))):
        reply = draw(st.one_of(st.none(), st.none(), st.sampled_from(["replies", "orders", "elsewhere"])))
        names = draw(st.sampled_from([[], ["status"], ["status", "region"]]) | st.lists(
            st.sampled_from(["status", "region", "tenant", "Seq", "a/b", "\x00key\x00"]), max_size=3, unique=True))
        out.append(JmsMessage(
            "org.exolab.jms.message.TextMessageImpl", "TextMessage",
            {"JMSMessageID": f"ID:h-{i}", "JMSCorrelationID": draw(st.one_of(st.none(), st.just(""), st.just("order-1"), _text)),
             "JMSReplyTo": None if reply is None else {"name": reply, "kind": "queue", "temporary": draw(st.booleans()),
                                                       "persistent": True},
             "JMSDestination": {"name": "orders", "kind": "queue", "temporary": False, "persistent": True},
             "JMSType": draw(st.one_of(st.none(), st.sampled_from(["Orders.Placed", "Orders.Cancelled", "Odd\x01Type"]))),
             "JMSDeliveryMode": draw(st.sampled_from([2, 2, 1])), "JMSPriority": draw(st.sampled_from([4, 4, 9])),
             "JMSTimestamp": draw(st.sampled_from([0, 1_764_000_000_123, 1_764_000_000_999])),
             "JMSExpiration": draw(st.sampled_from([0, 0, 0, 4_102_444_800_000])), "JMSRedelivered": False},
            {n: draw(_prop) for n in names},
            {"text": draw(st.one_of(st.none(), st.just('{"a": 1}'), _text))},
        ))
    return out


@pytest.fixture(scope="module")
def jms_store(tmp_path_factory: pytest.TempPathFactory) -> Jms:
    from tests.systems.test_openjms_source import MAPPING

    tmp = tmp_path_factory.mktemp("jms_lane")
    j = Jms(tmp, f"sqlite:///{tmp}/jms.db", f"sqlite:///{tmp}/nsb.db", system="openjms", queues=["orders"], mapping=MAPPING)
    j.seed()
    assert j.cli("init") == 0
    return j


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=jms_messages(), lock=st.booleans())
def test_openjms_lane_agrees_with_the_per_row_lanes_on_messages_of_every_shape(
        jms_store: Jms, messages: list[JmsMessage], lock: bool) -> None:
    j = jms_store
    with j.source.begin() as conn:
        conn.execute(j.jms_tables["message_handles"].delete())
        conn.execute(j.jms_tables["messages"].delete())
    blobs = []
    for m in messages:
        try:
            blobs.append(encode(m))
        except (UnicodeEncodeError, ValueError):
            blobs.append(None)  # what a Java writer cannot write either
    j.store(lambda c, t: [openjms_message(c, t, f"ID:h-{i}", QUEUE_ID, b, [QUEUE_ID * 100])
                          for i, b in enumerate(blobs) if b is not None])
    runner, rows = jms_rows(j, "orders")
    columnar, per_row, _ = lanes(runner, "orders", rows, lock)
    assert columnar == per_row


def test_the_property_test_reaches_the_lane(jms_store: Jms) -> None:
    """Not vacuous: ordinary messages of the strategy's kind are written by the lane itself."""
    j = jms_store
    with j.source.begin() as conn:
        conn.execute(j.jms_tables["message_handles"].delete())
        conn.execute(j.jms_tables["messages"].delete())
    msg = JmsMessage("org.exolab.jms.message.TextMessageImpl", "TextMessage",
                     {"JMSMessageID": "ID:x", "JMSCorrelationID": "c/\"1\"", "JMSReplyTo": None,
                      "JMSDestination": {"name": "orders", "kind": "queue", "temporary": False, "persistent": True},
                      "JMSType": "Orders.Placed", "JMSDeliveryMode": 2, "JMSPriority": 4, "JMSTimestamp": 1_764_000_000_123,
                      "JMSExpiration": 0, "JMSRedelivered": False},
                     {"region": {"type": "java.lang.String", "value": "eu/\"west\"\n"}}, {"text": '{"a": 1}'})
    j.store(lambda c, t: [openjms_message(c, t, f"ID:h-{i}", QUEUE_ID, encode(msg), [QUEUE_ID * 100]) for i in range(5)])
    runner, rows = jms_rows(j, "orders")
    columnar, per_row, by_lane = lanes(runner, "orders", rows, False)
    assert columnar == per_row and by_lane == 5
    with j.source.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(j.jms_tables["message_handles"])).scalar_one() == 5
