"""The groups of the columnar lane for OpenJMS and BizTalk (sources/plain_lane.py): rows that
share one example must differ only in what the lane fills in row by row. A fresh-eyes review of
the lane found two ways they did not, and these tests hold them: a row with a correlation (or
conversation) id grouped with one without took the other's choice of NServiceBus.CorrelationId
(60 of 70 rows of a queue of requests and replies got another id), and a header name that spells
a marker was filled with the row's key.

Each test compares Batch._settle (the lane first) with Batch._process on the same rows, as
tests/pipeline/test_columnar_lane_decoded.py does, on SQLite.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import orjson

from bridge.codecs.openjms_blob import JmsMessage
from bridge.codecs.openjms_encode import encode
from bridge.demo.samples import openjms_message
from bridge.pipeline.stats import PassStats
from bridge.sources.openjms import OpenJMSSource
from bridge.targets.writer import LaneBatch
from tests.pipeline.test_columnar_lane_decoded import jms_rows, lanes
from tests.systems.test_biztalk_source import SMALL, make_bt
from tests.systems.test_openjms_source import MAPPING, QUEUE_ID, Jms


def _jms_store(tmp: Path) -> Jms:
    j = Jms(tmp, f"sqlite:///{tmp}/jms.db", f"sqlite:///{tmp}/nsb.db", system="openjms", queues=["orders"], mapping=MAPPING)
    j.seed()
    assert j.cli("init") == 0
    return j


def _jms(i: int, correlation: str | None, properties: dict[str, Any] | None = None) -> JmsMessage:
    return JmsMessage(
        "org.exolab.jms.message.TextMessageImpl", "TextMessage",
        {"JMSMessageID": f"ID:r-{i}", "JMSCorrelationID": correlation, "JMSReplyTo": None,
         "JMSDestination": {"name": "orders", "kind": "queue", "temporary": False, "persistent": True},
         "JMSType": "Orders.Placed", "JMSDeliveryMode": 2, "JMSPriority": 4, "JMSTimestamp": 1_764_000_000_123,
         "JMSExpiration": 0, "JMSRedelivered": False},
        properties if properties is not None else {"region": {"type": "java.lang.String", "value": "eu"}},
        {"text": '{"a": 1}'})


def _store(j: Jms, msgs: list[JmsMessage]) -> None:
    j.store(lambda c, t: [openjms_message(c, t, f"ID:r-{i:03d}", QUEUE_ID, encode(m), [QUEUE_ID * 100])
                          for i, m in enumerate(msgs)])


def _agreed_headers(runner: Any, rows: list[Any], queue: str = "orders") -> dict[str, dict[str, str]]:
    """Each row's headers as the lane writes them (by message id), once the lane and the per-row
    lanes are seen to write the same."""
    by_id = _lane_rows(runner, queue, rows)
    columnar, per_row, _ = lanes(runner, queue, rows, False)
    assert columnar == per_row
    return by_id


def _lane_rows(runner: Any, queue: str, rows: list[Any]) -> dict[str, dict[str, str]]:
    """Each row's written headers (by message id), through the columnar lane."""
    runner.lane_min_rows = 1
    source = runner.sources[queue]
    outs, *_ = runner._settle(None, source, [r._replace(values=dict(r.values)) for r in rows], False,
                               PassStats(queue), {}, [])
    if len(outs) == 1 and isinstance(outs[0], LaneBatch):
        found = [orjson.loads(t.headers[i].as_py()) for t in outs[0].tables for i in range(len(t.positions))]
        found += [o.headers for _, o in outs[0].outs]
    else:  # the lane took no row: the per-row lanes wrote them all
        found = [o.headers for o in outs]
    return {h["NServiceBus.MessageId"]: h for h in found}


# -- 1. "no correlation/conversation id" and "one" are different groups ----------------------------
# The envelope writes a row's own id where it has one and its MessageId where it has none: an
# example made from one kind of row must not serve the other.

def test_a_correlated_row_grouped_after_an_uncorrelated_one_keeps_its_correlation_id(tmp_path: Path) -> None:
    j = _jms_store(tmp_path)
    _store(j, [_jms(0, None), _jms(1, "order-4711")])  # identical but for JMSCorrelationID
    by_id = _agreed_headers(*jms_rows(j, "orders"))
    correlations = sorted(h["NServiceBus.CorrelationId"] for h in by_id.values())
    # As the per-row lanes (and the validated path) write it, not the first row's MessageId.
    assert "order-4711" in correlations, correlations


def test_an_uncorrelated_row_grouped_after_a_correlated_one_gets_its_message_id(tmp_path: Path) -> None:
    j = _jms_store(tmp_path)
    _store(j, [_jms(0, "order-4711"), _jms(1, None)])  # the other order: the example has an id
    by_id = _agreed_headers(*jms_rows(j, "orders"))
    # Per-row: a message without a correlation id correlates with itself (CorrelationId = MessageId).
    assert all(h["NServiceBus.CorrelationId"] for h in by_id.values()), \
        [h["NServiceBus.CorrelationId"] for h in by_id.values()]


def _bstr(text: str) -> bytes:
    data = text.encode("utf-16-le") + b"\x00\x00"
    return struct.pack("<i", len(data)) + data


def _context(props: list[tuple[str, str, int, str]]) -> bytes:
    """A C4 imgContext bag (tests/fixtures/biztalk/README.md) of BSTR properties (namespace, name, type, value)."""
    by_ns: dict[str, list[tuple[str, int, str]]] = {}
    for ns, name, ptype, value in props:
        by_ns.setdefault(ns, []).append((name, ptype, value))
    out = bytes.fromhex("C4E0906C1849D311A24200C04F60A533") + struct.pack("<i", len(by_ns))
    for ns, items in by_ns.items():
        out += _bstr(ns) + struct.pack("<i", len(items))
        for name, ptype, value in items:
            out += _bstr(name) + struct.pack("<i", ptype) + struct.pack("<BH", 0, 8) + _bstr(value)
    return out


BTS = "http://schemas.microsoft.com/BizTalk/2003/system-properties"


def test_a_biztalk_interchange_id_beside_an_entry_without_one_is_kept(tmp_path: Path, request: Any) -> None:
    """BTS.InterchangeID as a predicate-only property (type 4: no header) in one entry, absent in
    the other: the same header names, so one group; the lane writes ConversationId = MessageId for
    the entry whose per-row ConversationId is its interchange id."""
    for bt in make_bt("sqlite", request, tmp_path):
        mt = (BTS, "MessageType", 2, "http://example.org/orders#Order")
        bt.publish(context=_context([mt]), parts=[SMALL])
        bt.publish(context=_context([mt, (BTS, "InterchangeID", 4, "{7D1C3A52-0F4E-4B8B-9C2D-5E6F7A8B9C0D}")]),
                   parts=[SMALL])
        runner = bt.runner()
        source = runner.sources["BizTalkServerApplication"]
        with runner.source_engine.connect() as conn:
            rows = source.fetch_keys(conn, list(source.iter_keys(conn)), False)
        assert len(rows) == 2
        # First the interchange-less entry, then the other (the group's example is the first).
        rows.sort(key=lambda r: "InterchangeID".encode("utf-16-le") in bytes(r.values["imgContext"]))
        by_id = _agreed_headers(runner, rows, "BizTalkServerApplication")
        conversations = sorted(h["NServiceBus.ConversationId"] for h in by_id.values())
        assert "{7D1C3A52-0F4E-4B8B-9C2D-5E6F7A8B9C0D}" in conversations, conversations


# -- 2. a marker spelled in text the example keeps real ---------------------------------------------
# The lane's template is split on `\u0000<word>\u0000` (envelope_columns._MARKER). A JMS property
# named "\x00key\x00" becomes the header name "JMS.Property.\x00key\x00", which the template would
# read as the `key` marker: such a row is left to the per-row lanes.

def test_a_property_name_that_spells_a_marker_is_written_as_it_is(tmp_path: Path) -> None:
    j = _jms_store(tmp_path)
    props = {"\x00key\x00": {"type": "java.lang.String", "value": "x"}}
    _store(j, [_jms(i, "c", props) for i in range(2)])
    for h in _agreed_headers(*jms_rows(j, "orders")).values():
        assert "JMS.Property.\x00key\x00" in h, sorted(n for n in h if n.startswith("JMS.Property"))


def test_sync_once_writes_requests_and_replies_of_one_queue_with_their_own_correlation_ids(tmp_path: Path) -> None:
    """End to end, at the source's own lane_min_rows: a pass over a few more new handles than it,
    every 7th one a request without JMSCorrelationID, the rest replies correlated to it. Each
    delivered row must carry its own correlation id (or, without one, its MessageId), as the
    per-row lane writes it."""
    n = OpenJMSSource.lane_min_rows + 6
    j = _jms_store(tmp_path)
    _store(j, [_jms(i, None if i % 7 == 0 else f"corr-{i}") for i in range(n)])
    assert j.cli("sync", "--once") == 0
    rows = j.rows("Orders")
    assert len(rows) == n
    wrong = []
    for r in rows:
        h = r["headers"]
        i = int(h["JMS.MessageID"].rsplit("-", 1)[1])
        expected = h["NServiceBus.MessageId"] if i % 7 == 0 else f"corr-{i}"
        if h["NServiceBus.CorrelationId"] != expected:
            wrong.append((i, h["NServiceBus.CorrelationId"], expected))
    assert not wrong, f"{len(wrong)} of {n} rows with another CorrelationId, e.g. {wrong[:3]}"
