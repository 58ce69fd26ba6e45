"""The OpenJMS reader specialised to OpenJMS's own layout (openjms_fast) against the generic
Java-serialization reader: on every golden vector, on what the encoder writes for every body
kind and property type, and on fuzzed input, it gives the generic reader's exact answer or
declines (None), and `decode` then gives the generic answer. It must never give another answer.

Its compiled twin (openjms_native, issue 49), which `decode` uses when it is built, is held to it
on every one of those blobs: the very same answer (types too: True is not 1) or the same decline."""

from __future__ import annotations

import base64
import struct
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs import compiled, openjms_blob, openjms_fast
from bridge.codecs.javaser import mutf8
from bridge.codecs.openjms_blob import PKG, BlobError, JmsMessage, decode, decode_fast, decode_generic
from bridge.codecs.openjms_encode import encode
from tests.codecs.test_fuzz_decoders import OPENJMS, mutated

FIXTURES = Path(__file__).parents[1] / "fixtures" / "openjms"
FUZZ = settings(max_examples=1000, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)


def test_the_compiled_reader_is_built_and_used() -> None:
    # setup.py builds it at install (gcc is among what .ci/run installs); without it every
    # OpenJMS migration runs ~5x slower, which a test run must not hide
    assert openjms_blob.COMPILED is not None, "bridge.codecs.openjms_native was not built: pip install -e . with gcc"
    assert openjms_blob._read_parts is openjms_blob.COMPILED


def same_or_declined(blob: bytes) -> JmsMessage | None:
    """The fast reader's answer, checked against the generic one: equal, or a decline; and the
    compiled reader's answer, the very same as the pure-Python one's."""
    pure = openjms_fast.read(blob)
    if openjms_blob.COMPILED is not None:
        assert repr(openjms_blob.COMPILED(blob)) == repr(pure), "the compiled reader answers otherwise than openjms_fast"
    fast = decode_fast(blob)
    try:
        generic = decode_generic(blob)
    except BlobError:
        assert fast is None, "the fast reader read a blob the generic reader refuses"
        return None
    if fast is not None:
        assert fast.to_json() == generic.to_json()
    assert decode(blob).to_json() == generic.to_json()
    return fast


@pytest.mark.parametrize("path", OPENJMS, ids=[p.name for p in OPENJMS])
def test_fast_reader_takes_every_fixture_and_agrees(path: Path) -> None:
    assert same_or_declined(path.read_bytes()) is not None, "declined a blob OpenJMS itself wrote"


def test_every_fixture_agrees_in_any_order() -> None:
    # Descriptors are remembered across blobs: a blob read after others must read the same.
    blobs = [p.read_bytes() for p in OPENJMS]
    first = [decode_fast(b).to_json() for b in blobs]
    assert [decode_fast(b).to_json() for b in reversed(blobs)] == first[::-1]


# -- blobs the encoder writes ---------------------------------------------------------------------
def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def typed(kind: str, value: Any) -> dict[str, Any]:
    return {"type": kind, "base64": b64(value)} if kind == "byte[]" else {"type": kind, "value": value}


def float32(x: float) -> float:
    return struct.unpack(">f", struct.pack(">f", x))[0]


_text = st.text(max_size=60)
_values = st.one_of(
    st.builds(lambda v: typed("java.lang.String", v), st.text(max_size=300)),
    st.builds(lambda v: typed("java.lang.Boolean", v), st.booleans()),
    st.builds(lambda v: typed("java.lang.Byte", v), st.integers(-128, 127)),
    st.builds(lambda v: typed("java.lang.Short", v), st.integers(-2**15, 2**15 - 1)),
    st.builds(lambda v: typed("java.lang.Character", v),
              st.characters(max_codepoint=0xFFFF, exclude_categories=["Cs"])),
    st.builds(lambda v: typed("java.lang.Integer", v), st.integers(-2**31, 2**31 - 1)),
    st.builds(lambda v: typed("java.lang.Long", v), st.integers(-2**63, 2**63 - 1)),
    st.builds(lambda v: typed("java.lang.Float", float32(v)), st.floats(allow_nan=False, width=32)),
    st.builds(lambda v: typed("java.lang.Double", v), st.floats(allow_nan=False)),
    st.builds(lambda v: typed("byte[]", v), st.binary(max_size=200)),
    st.just({"type": None, "value": None}),
)
_plain_destination = st.builds(lambda name, kind, persistent: {"name": name, "kind": kind, "temporary": False,
                                                                "persistent": persistent},
                               _text, st.sampled_from(["queue", "topic"]), st.booleans())
_temporary_destination = st.builds(
    lambda name, kind, connection: {"name": name, "kind": kind, "temporary": True, "persistent": False,
                                    "connectionId": connection},
    _text, st.sampled_from(["queue", "topic"]), st.one_of(st.integers(-2**63, 2**63 - 1), st.none(), _text))
_bodies = st.one_of(
    st.tuples(st.just("TextMessageImpl"), st.builds(lambda t: {"text": t}, st.one_of(st.none(), st.text(max_size=3000)))),
    st.tuples(st.just("BytesMessageImpl"), st.builds(lambda b: {"base64": b64(b)}, st.binary(max_size=3000))),
    st.tuples(st.just("ObjectMessageImpl"), st.builds(lambda b: {"base64": b64(b)}, st.binary(max_size=300))),
    st.tuples(st.just("MapMessageImpl"), st.builds(lambda m: {"map": m}, st.dictionaries(_text, _values, max_size=20))),
    st.tuples(st.just("StreamMessageImpl"), st.builds(lambda v: {"values": v}, st.lists(_values, max_size=20))),
    st.tuples(st.just("MessageImpl"), st.just({})),
)


@st.composite
def messages(draw: st.DrawFn) -> JmsMessage:
    cls, body = draw(_bodies)
    optional = lambda s: draw(st.one_of(st.none(), s))  # noqa: E731
    headers = {
        "JMSMessageID": optional(st.builds(lambda t: "ID:" + t, _text)),
        "JMSCorrelationID": optional(st.one_of(_text, st.builds(lambda t: "ID:" + t, _text))),
        "JMSReplyTo": optional(st.one_of(_plain_destination, _temporary_destination)),
        "JMSDestination": optional(_plain_destination),
        "JMSType": optional(_text),
        "JMSDeliveryMode": optional(st.sampled_from([1, 2])),
        "JMSPriority": optional(st.integers(0, 9)),
        "JMSTimestamp": optional(st.integers(-2**63, 2**63 - 1)),
        "JMSExpiration": draw(st.integers(-2**63, 2**63 - 1)),
        "JMSRedelivered": draw(st.booleans()),
    }
    internal = {"readOnly": draw(st.booleans()), "processed": draw(st.booleans()),
                "acceptedTime": draw(st.integers(0, 2**62)), "sequenceNumber": draw(st.integers(0, 2**62)),
                "wildcard": optional(_text), "consumerIdString": optional(_text),
                "consumerId": draw(st.integers(0, 2**62))}
    properties = draw(st.dictionaries(st.text(min_size=1, max_size=40), _values, max_size=25))
    return JmsMessage(PKG + cls, cls.removesuffix("Impl"), headers, properties, body, internal)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(messages())
def test_encoder_blobs_of_every_body_and_property_type_agree(msg: JmsMessage) -> None:
    assert same_or_declined(encode(msg)) is not None, "declined a blob in OpenJMS's own layout"


def test_every_body_kind_and_property_type_is_taken() -> None:
    props = {f"p{i}": v for i, v in enumerate([
        typed("java.lang.String", "s"), typed("java.lang.Boolean", True), typed("java.lang.Byte", -3),
        typed("java.lang.Short", 300), typed("java.lang.Character", "\u00e9"), typed("java.lang.Integer", 7),
        typed("java.lang.Long", 2**40), typed("java.lang.Float", 1.5), typed("java.lang.Double", 0.1),
        typed("byte[]", b"\x00\xff"), {"type": None, "value": None}])}
    bodies = {"TextMessageImpl": {"text": "x" * 70000}, "BytesMessageImpl": {"base64": b64(bytes(5000))},
              "ObjectMessageImpl": {"base64": "rO0ABQ=="}, "MapMessageImpl": {"map": props},
              "StreamMessageImpl": {"values": list(props.values())}, "MessageImpl": {}}
    for cls, body in bodies.items():
        msg = JmsMessage(PKG + cls, cls.removesuffix("Impl"), {"JMSMessageID": "ID:1", "JMSExpiration": 0}, props, body)
        fast = same_or_declined(encode(msg))
        assert fast is not None and fast.body == body and fast.properties == props, cls


# -- fuzzed input: the same answer or a decline, never another answer or an exception -------------
_encoded = messages().map(encode)


@st.composite
def structural(draw: st.DrawFn, seeds: st.SearchStrategy[bytes]) -> bytes:
    """A blob with bytes set to the values the stream's grammar turns on: type codes, lengths,
    handle numbers and versions."""
    data = bytearray(draw(seeds))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.sampled_from([*range(0x70, 0x7F), 0x00, 0x01, 0x02, 0x08, 0x0C, 0x7E, 0x80, 0xFF]))
    return bytes(data)


@FUZZ
@given(st.one_of(mutated(OPENJMS), structural(st.sampled_from(OPENJMS).map(Path.read_bytes)),
                 st.binary(max_size=512).map(lambda b: b"\xac\xed\x00\x05" + b)))
def test_mutated_fixtures_and_random_streams_agree_or_decline(blob: bytes) -> None:
    same_or_declined(blob)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(structural(_encoded))
def test_mutated_encoder_blobs_agree_or_decline(blob: bytes) -> None:
    same_or_declined(blob)


# -- what only the generic reader reads ----------------------------------------------------------
def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _leftover_in_timestamp() -> bytes:
    blob = _fixture("text_simple.bin")
    at = blob.index(b"java.util.Date")
    at = blob.index(b"\x77\x10", at)  # the Timestamp's payload: long version, long millis
    return blob[:at] + b"\x77\x11" + blob[at + 2:at + 18] + b"\x00" + blob[at + 18:]


def _other_hashmap_field() -> bytes:
    return _fixture("text_simple.bin").replace(b"threshold", b"threshole")


@pytest.mark.parametrize("make", [_leftover_in_timestamp, _other_hashmap_field])
def test_what_the_fast_reader_does_not_expect_goes_to_the_generic_reader(make) -> None:
    blob = make()
    decode_fast(_fixture("text_simple.bin"))  # its descriptors remembered first
    assert decode_fast(blob) is None
    assert decode(blob).to_json() == decode_generic(blob).to_json()


def test_a_pre_076_message_id_is_read_alike() -> None:
    # Version 1 wrote the id as a String object without "ID:"; no back-reference follows it in
    # plain_msg, so the extra handle shifts nothing.
    blob = _fixture("plain_msg.bin")
    at = blob.index(b"\x77", blob.index(b"org.exolab.jms.message.MessageId"))
    end = at + 2 + blob[at + 1]
    text = blob[at + 12:end].removeprefix(b"ID:")
    v1 = blob[:at] + b"\x77\x08" + struct.pack(">q", 1) + b"\x74" + struct.pack(">H", len(text)) + text + blob[end:]
    fast = same_or_declined(v1)
    assert fast is not None and fast.headers["JMSMessageID"] == "ID:" + text.decode()


def test_without_the_compiled_reader_decode_warns_once_and_reads_alike(monkeypatch, caplog) -> None:
    blob = _fixture("text_simple.bin")
    expected = decode(blob).to_json()
    monkeypatch.setattr(openjms_blob, "COMPILED", None)
    monkeypatch.setattr(openjms_blob, "_read_parts", openjms_fast.read)
    monkeypatch.setattr(compiled, "_told", set())
    with caplog.at_level("WARNING", logger="qbridge.codecs"):
        assert decode(blob).to_json() == expected
        assert decode(blob).to_json() == expected
    told = [r.getMessage() for r in caplog.records if "pure-Python reader" in r.getMessage()]
    assert len(told) == 1 and "C compiler" in told[0]


def _cesu8(units: list[int]) -> bytes:
    """Java's modified UTF-8 of UTF-16 code units: NUL as C0 80, each surrogate on its own."""
    out = bytearray()
    for u in units:
        if 0 < u < 0x80:
            out.append(u)
        elif u < 0x800:
            out += bytes([0xC0 | u >> 6, 0x80 | u & 0x3F])
        else:
            out += bytes([0xE0 | u >> 12, 0x80 | (u >> 6) & 0x3F, 0x80 | u & 0x3F])
    return bytes(out)


def _decoded(decoder, data: bytes) -> object:
    try:
        return decoder(data)
    except Exception as e:  # noqa: BLE001 - which error is compared too
        return type(e)


_units = st.lists(st.one_of(st.integers(0, 0x7F), st.integers(0, 0x7FF), st.integers(0, 0xFFFF),
                            st.integers(0xD800, 0xDBFF), st.integers(0xDC00, 0xDFFF)), max_size=12)


@settings(max_examples=800, deadline=None, derandomize=True)
@given(st.one_of(_units.map(_cesu8), st.binary(max_size=12),
                 st.tuples(_units.map(_cesu8), st.integers(0, 40), st.integers(0, 255)).map(
                     lambda t: t[0][:t[1]] + bytes([t[2]]) + t[0][t[1] + 1:])))
def test_the_compiled_modified_utf8_decoder_is_javasers(data: bytes) -> None:
    from bridge.codecs.openjms_native import modified_utf8

    assert repr(_decoded(modified_utf8, data)) == repr(_decoded(mutf8, data))


def test_a_boxed_value_without_its_field_is_a_blob_error_not_a_key_error() -> None:
    """A blob whose java.lang.Boolean class names its field otherwise (found by the mutation test):
    the fast readers decline it and the generic one said KeyError('value'), which no caller reads
    as a bad row; it is a BlobError that names the missing field."""
    blob = (FIXTURES / "map_msg.bin").read_bytes()
    needle = b"java.lang.Boolean\xcd r\x80\xd5\x9c\xfa\xee\x02\x00\x01Z\x00\x05value"
    assert blob.count(needle) == 1
    bad = blob.replace(needle, needle[:-5] + b"palue")
    assert decode_fast(bad) is None
    with pytest.raises(BlobError, match="no field 'value'"):
        decode(bad)


def test_a_class_that_is_its_own_superclass_is_a_blob_error_not_an_endless_chain() -> None:
    """A 63-byte blob (a review's): a class descriptor whose superclass is a back-reference to
    itself. ClassDesc.chain() followed it forever, growing a list until the OOM killer took the
    worker, at every pass over the row; it is a BlobError that says so."""
    def utf(text: str) -> bytes:
        return struct.pack(">H", len(text)) + text.encode()

    blob = (b"\xac\xed\x00\x05" + b"\x73" + b"\x72" + utf("org.exolab.jms.message.TextMessageImpl") + struct.pack(">q", 1)
            + b"\x02" + struct.pack(">h", 0) + b"\x78" + b"\x71" + struct.pack(">i", 0x7E0000))
    assert len(blob) == 63 and decode_fast(blob) is None
    with pytest.raises(BlobError, match="is its own superclass"):
        decode(blob)
    # two descriptors, each the other's superclass: the second names the first, still being read
    two = (b"\xac\xed\x00\x05" + b"\x73" + b"\x72" + utf("org.exolab.jms.message.TextMessageImpl") + struct.pack(">q", 1)
           + b"\x02" + struct.pack(">h", 0) + b"\x78"
           + b"\x72" + utf("org.exolab.jms.message.MessageImpl") + struct.pack(">q", 1) + b"\x02" + struct.pack(">h", 0) + b"\x78"
           + b"\x71" + struct.pack(">i", 0x7E0000))
    with pytest.raises(BlobError, match="is its own superclass"):
        decode(two)
