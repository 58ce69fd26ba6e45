"""The OpenJMS messageBlob encoder, proved byte for byte: every fixture made by OpenJMS's own
classes (Text, Bytes, Map, Object and plain messages), decoded by qbridge and encoded again,
gives the fixture's exact bytes; and what the encoder writes for a new message reads back."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.codecs.javaser_write import hashmap_layout, java_string_hash
from bridge.codecs.openjms_blob import JmsMessage, decode
from bridge.codecs.openjms_encode import encode

FIXTURES = Path(__file__).parents[1] / "fixtures" / "openjms"
ROUND_TRIP = sorted(p.name for p in FIXTURES.glob("*.bin"))


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_fixture_round_trips_byte_for_byte(name: str) -> None:
    blob = (FIXTURES / name).read_bytes()
    assert encode(decode(blob)) == blob


def test_every_text_bytes_and_map_fixture_is_covered() -> None:
    kinds = {decode((FIXTURES / n).read_bytes()).message_type for n in ROUND_TRIP}
    assert {"TextMessage", "BytesMessage", "MapMessage", "StreamMessage", "ObjectMessage", "Message"} <= kinds


def test_java_string_hash_and_hashmap_order() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112  # Java's classic collision
    assert java_string_hash("status") == (-892481550) & 0xFFFFFFFF  # "status".hashCode() in Java
    capacity, threshold, order = hashmap_layout([f"k{i}" for i in range(13)])
    assert (capacity, threshold) == (32, 24)  # the 13th put resizes 16 -> 32
    assert hashmap_layout([]) == (16, 0, [])


def test_a_new_message_reads_back() -> None:
    msg = JmsMessage(
        "org.exolab.jms.message.TextMessageImpl", "TextMessage",
        {"JMSMessageID": "ID:qbridge-1", "JMSCorrelationID": "order-7",
         "JMSReplyTo": {"name": "replies", "kind": "queue", "temporary": False, "persistent": True},
         "JMSDestination": {"name": "orders", "kind": "queue", "temporary": False, "persistent": True},
         "JMSType": "Orders.OrderAccepted", "JMSDeliveryMode": 2, "JMSPriority": 4, "JMSTimestamp": 1764000000000,
         "JMSExpiration": 0, "JMSRedelivered": False},
        {"NServiceBus_MessageId": {"type": "java.lang.String", "value": "5b0c…"},
         "count": {"type": "java.lang.Integer", "value": 3}},
        {"text": "Zażółć 🚀 " + "x" * 3000},
    )
    back = decode(encode(msg))
    assert back.headers["JMSReplyTo"]["name"] == "replies" and back.headers["JMSCorrelationID"] == "order-7"
    assert back.properties == msg.properties and back.body == msg.body


_values = st.one_of(
    st.builds(lambda v: {"type": "java.lang.String", "value": v}, st.text(max_size=300)),
    st.builds(lambda v: {"type": "java.lang.Integer", "value": v}, st.integers(-2**31, 2**31 - 1)),
    st.builds(lambda v: {"type": "java.lang.Long", "value": v}, st.integers(-2**63, 2**63 - 1)),
    st.builds(lambda v: {"type": "java.lang.Double", "value": v}, st.floats(allow_nan=False)),
    st.builds(lambda v: {"type": "java.lang.Boolean", "value": v}, st.booleans()),
    st.builds(lambda v: {"type": "byte[]", "base64": base64.b64encode(v).decode()}, st.binary(max_size=200)),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(props=st.dictionaries(st.text(min_size=1, max_size=40), _values, max_size=30),
       text=st.one_of(st.none(), st.text(max_size=3000)), mid=st.text(min_size=1, max_size=60))
def test_any_message_reads_back(props: dict, text: str | None, mid: str) -> None:
    msg = JmsMessage(
        "org.exolab.jms.message.TextMessageImpl", "TextMessage",
        {"JMSMessageID": "ID:" + mid, "JMSCorrelationID": None, "JMSReplyTo": None,
         "JMSDestination": {"name": "q", "kind": "queue", "temporary": False, "persistent": True},
         "JMSType": "TextMessage", "JMSDeliveryMode": 2, "JMSPriority": 4, "JMSTimestamp": 1, "JMSExpiration": 0,
         "JMSRedelivered": False},
        props, {"text": text},
    )
    back = decode(encode(msg))
    assert back.properties == props and back.body == {"text": text}
    assert back.headers["JMSMessageID"] == "ID:" + mid
