"""Review of the compiled readers (openjms_native, biztalk_native) against their pure-Python
references.

Finding: openjms_native recurses in C (cdef obj -> hashmap/external -> obj ...) with no depth
bound. The reference (openjms_fast) is bounded by Python's recursion limit (RecursionError ->
None), so a blob nesting objects tens of thousands deep is declined by the reference, while
the compiled reader overflows the C stack: SIGSEGV, the whole migration process dies. The
crash tests run the native reader in a subprocess, in a thread with a fixed 4 MiB stack so the
result does not depend on the machine's `ulimit -s`.

The other tests guard edges that were checked and hold on HEAD (floats, boxes, surrogates,
joined block data, OLE dates).
"""

from __future__ import annotations

import itertools
import math
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.codecs import javaser, openjms_fast
from bridge.codecs.biztalk import decode_context_python
from bridge.codecs.biztalk_values import CLSID_C4
from bridge.codecs.javaser import JavaStreamError, mutf8
from bridge.codecs.openjms_blob import PKG, JmsMessage
from bridge.codecs.openjms_encode import encode

openjms_native = pytest.importorskip("bridge.codecs.openjms_native")
biztalk_native = pytest.importorskip("bridge.codecs.biztalk_native")

ROOT = Path(__file__).parents[2]
BASE_HANDLE = 0x7E0000

_RUN_NATIVE = r"""
import sys, threading
from bridge.codecs import openjms_native
blob = sys.stdin.buffer.read()
out = []
threading.stack_size(4 * 2**20)
t = threading.Thread(target=lambda: out.append(openjms_native.read(blob)))
t.start(); t.join()
print(repr(out[0]) if out else "EXCEPTION")
"""


def _native_in_subprocess(blob: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", _RUN_NATIVE], input=blob, capture_output=True, cwd=ROOT, timeout=120,
                          check=False)


def _handle_of(blob: bytes, class_name: str) -> int:
    reader = javaser.Reader(blob)
    reader.stream()
    return next(i for i, h in enumerate(reader.handles) if getattr(h, "name", None) == class_name)


def _message(properties: dict | None = None, internal: dict | None = None) -> bytes:
    return encode(JmsMessage(PKG + "MessageImpl", "Message", {"JMSMessageID": "ID:1", "JMSExpiration": 0},
                             properties or {}, {}, internal or {}))


def nested_hashmaps(depth: int) -> bytes:
    """A property whose value is a HashMap holding a HashMap ... `depth` deep (29 bytes a level)."""
    base = _message({"k": {"type": "java.lang.String", "value": "PLACEHOLDER"}})
    handle = _handle_of(base, "java.util.HashMap")
    level = (b"\x73\x71" + struct.pack(">i", BASE_HANDLE + handle) + struct.pack(">fi", 0.75, 12)
             + b"\x77\x08" + struct.pack(">ii", 16, 1) + b"\x74\x00\x01a")
    placeholder = b"\x74\x00\x0bPLACEHOLDER"
    assert base.count(placeholder) == 1
    return base.replace(placeholder, level * depth + b"\x70" + b"\x78" * depth)


def nested_message_ids(depth: int) -> bytes:
    """Version-1 MessageIds, each holding the next as its String object (16 bytes a level)."""
    base = _message(internal={"wildcard": "WILDCARDPH"})
    handle = _handle_of(base, "org.exolab.jms.message.MessageId")
    level = b"\x73\x71" + struct.pack(">i", BASE_HANDLE + handle) + b"\x77\x08" + struct.pack(">q", 1)
    placeholder = b"\x74\x00\x0aWILDCARDPH"
    assert base.count(placeholder) == 1
    return base.replace(placeholder, level * depth + b"\x74\x00\x01x" + b"\x78" * depth)


@pytest.mark.parametrize("make, depth", [(nested_hashmaps, 200_000), (nested_message_ids, 300_000)],
                         ids=["hashmaps", "message_ids"])
def test_openjms_native_declines_deep_nesting_without_crashing(make, depth) -> None:
    blob = make(depth)
    assert openjms_fast.read(blob) is None  # the reference: RecursionError, caught -> decline
    done = _native_in_subprocess(blob)
    assert done.returncode == 0, f"openjms_native.read crashed (exit {done.returncode}) on a {len(blob)}-byte blob " \
                                 f"nesting {depth} objects: unbounded C recursion"
    assert done.stdout.strip() == b"None"


def test_nesting_builders_are_read_as_intended_when_shallow() -> None:
    # depth 0 keeps the message valid: the builders rewrite the slot they aim at and nothing else
    assert openjms_fast.read(nested_hashmaps(0)) is not None
    assert repr(openjms_native.read(nested_hashmaps(0))) == repr(openjms_fast.read(nested_hashmaps(0)))
    for depth in (1, 2, 50):
        for blob in (nested_hashmaps(depth), nested_message_ids(depth)):
            assert openjms_native.read(blob) is None and openjms_fast.read(blob) is None


# -- guards: edges that hold on HEAD ----------------------------------------------------------------
def _same(blob: bytes) -> Any:
    pure = openjms_fast.read(blob)
    assert repr(openjms_native.read(blob)) == repr(pure)
    return pure


_MUTF8_BYTES = st.lists(st.sampled_from([0x00, 0x41, 0x7F, 0x80, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
                                         0xE1, 0xED, 0xEF, 0xF0, 0xF4, 0xF8, 0xFF]), min_size=1, max_size=14).map(bytes)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(st.one_of(_MUTF8_BYTES, st.binary(max_size=12)))
def test_modified_utf8_equals_mutf8(data: bytes) -> None:
    try:
        expected = mutf8(data)
    except JavaStreamError:
        with pytest.raises(JavaStreamError):
            openjms_native.modified_utf8(data)
        return
    assert openjms_native.modified_utf8(data) == expected


def test_surrogate_pairs_and_lone_surrogates_in_modified_utf8() -> None:
    enc = lambda u: b"\xc0\x80" if u == 0 else chr(u).encode("utf-8", "surrogatepass")
    units = [0xD800, 0xDBFF, 0xDC00, 0xDFFF, 0x41, 0, 0xE9, 0xFFFF]
    for combo in itertools.product(units, repeat=3):
        data = b"".join(enc(u) for u in combo)
        assert openjms_native.modified_utf8(data) == mutf8(data), data.hex()


def _two_slot_map(kind: str, value: object) -> bytes:
    return encode(JmsMessage(PKG + "MapMessageImpl", "MapMessage", {"JMSMessageID": "ID:1", "JMSExpiration": 0},
                             {"p": {"type": kind, "value": value}}, {"map": {"q": {"type": kind, "value": value}}}, {}))


@pytest.mark.parametrize("kind, a, b, raws", [
    ("java.lang.Float", 1.5, struct.unpack(">f", bytes.fromhex("3fc00001"))[0], [struct.pack(">I", x) for x in
                                   (0x7F800001, 0xFF800001, 0x7FC00000, 0x80000000, 1, 0x807FFFFF, 0x7F800000)]),
    ("java.lang.Double", 1.5, math.nextafter(1.5, 2.0), [struct.pack(">Q", x) for x in
                                    (0x7FF0000000000001, 0xFFF8000000000001, 1 << 63, 1, 0x800FFFFFFFFFFFFF)]),
    ("java.lang.Boolean", True, False, [bytes([x]) for x in (0, 1, 2, 0xFF)]),
    ("java.lang.Byte", 5, 4, [bytes([x]) for x in (0x80, 0xFF, 0x7F)]),
    ("java.lang.Short", 300, 301, [struct.pack(">H", x) for x in (0x8000, 0xFFFF, 0x7FFF)]),
    ("java.lang.Character", "\u1234", "\u1235", [struct.pack(">H", x) for x in (0xD800, 0xDFFF, 0xFFFF, 0)]),
    ("java.lang.Integer", 7, 6, [struct.pack(">I", x) for x in (1 << 31, 2**32 - 1)]),
    ("java.lang.Long", 7, 6, [struct.pack(">Q", x) for x in (1 << 63, 2**64 - 1)]),
])
def test_box_values_at_their_edges_read_alike(kind: str, a: object, b: object, raws: list[bytes]) -> None:
    one, two = _two_slot_map(kind, a), _two_slot_map(kind, b)
    differing = [i for i in range(len(one)) if one[i] != two[i]]
    size = len(raws[0])
    runs: list[int] = []  # the two value fields (property, map body): where their differing bytes start
    for i in differing:
        if not runs or i >= runs[-1] + size:
            runs.append(i)
    assert len(runs) == 2
    ends = [max(i for i in differing if r <= i < r + size) + 1 for r in runs]
    for raw in raws:
        blob = bytearray(one)
        for end in ends:
            blob[end - size:end] = raw
        got = _same(bytes(blob))
        assert got is not None
        native = openjms_native.read(bytes(blob))
        for slot in ("p", None):
            want = got[2]["p"]["value"] if slot else got[3]["map"]["q"]["value"]
            have = native[2]["p"]["value"] if slot else native[3]["map"]["q"]["value"]
            assert type(have) is type(want)
            if isinstance(want, float):  # NaN payloads and -0.0 too
                assert struct.pack(">d", have) == struct.pack(">d", want)


def test_lone_surrogates_in_utf16_fields_read_alike() -> None:
    ph = "\u1234\u5678\u9abc"
    dest = {"name": ph, "kind": "queue", "temporary": False, "persistent": True}
    base = encode(JmsMessage(PKG + "MessageImpl", "Message", {"JMSMessageID": "ID:1", "JMSExpiration": 0, "JMSType": ph,
                                                              "JMSCorrelationID": ph, "JMSDestination": dest}, {}, {}, {}))
    pattern = ph.encode("utf-16-be")
    assert base.count(pattern) == 3
    for combo in itertools.product([0xD800, 0xDBFF, 0xDC00, 0xDFFF, 0x41, 0xFEFF, 0xFFFE, 0], repeat=3):
        blob = base.replace(pattern, b"".join(u.to_bytes(2, "big") for u in combo))
        assert _same(blob) is not None


def test_block_data_split_anywhere_reads_alike() -> None:
    fixtures = sorted((ROOT / "tests" / "fixtures" / "openjms").glob("*.bin"))
    rnd = random.Random(49)
    for path in fixtures:
        blob = path.read_bytes()
        # every TC_BLOCKDATA the layout reads (77 len ...), split in two segments, one of them long
        for at in [i for i in range(5, len(blob) - 2) if blob[i] == 0x77][:12]:
            n = blob[at + 1]
            if at + 2 + n >= len(blob) or n < 2:
                continue
            cut = rnd.randint(1, n - 1)
            payload = blob[at + 2:at + 2 + n]
            split = bytes([0x77, cut]) + payload[:cut] + b"\x7a" + struct.pack(">i", n - cut) + payload[cut:]
            _same(blob[:at] + split + blob[at + 2 + n:])


def _bag(vt: int, payload: bytes) -> bytes:
    def s(text: str) -> bytes:
        raw = text.encode("utf-16-le") + b"\0\0"
        return struct.pack("<i", len(raw)) + raw
    return (CLSID_C4 + struct.pack("<i", 1) + s("ns") + struct.pack("<i", 1) + s("n") + struct.pack("<i", 1)
            + bytes([0]) + struct.pack("<H", vt) + payload)


def _bag_same(blob: bytes) -> None:
    native = biztalk_native.decode_context(blob)
    try:
        expected = decode_context_python(blob)
    except (ValueError, OverflowError):
        assert native is None
        return
    assert repr(native) == repr(expected)


def test_ole_dates_at_the_edges_read_alike() -> None:
    rnd = random.Random(7)
    values = [0.0, -0.0, 5e-324, -5e-324, 2958465.0, 2958465.9999999999, 2958466.0, -2958466.0, -328716.0,
              -328715.99999999, -657434.0, -693594.0, -0.5, 0.5, math.inf, -math.inf, math.nan, -1.0000000001]
    for _ in range(20000):
        day = rnd.randint(-700000, 2958466)
        ms = rnd.randint(0, 86_400_000)
        values.append(day + (ms + 0.5) / 86_400_000 * rnd.choice([1, -1]))
        values.append(math.nextafter(day + ms / 86_400_000, rnd.choice([math.inf, -math.inf])))
    for v in values:
        _bag_same(_bag(7, struct.pack("<d", v)))


@pytest.mark.parametrize("vt, raw", [(16, b"\x80"), (2, b"\x00\x80"), (17, b"\xff"), (18, b"\xff\xff"), (11, b"\x00\x80"),
                                     (19, b"\xff\xff\xff\xff"), (20, struct.pack("<Q", 0x8000000000000001)),
                                     (21, b"\xff" * 8), (6, struct.pack("<q", -(2**63))), (4, struct.pack("<I", 0x7F800001)),
                                     (5, struct.pack("<Q", 0xFFF8000000000001))])
def test_biztalk_signed_and_unsigned_edges_read_alike(vt: int, raw: bytes) -> None:
    _bag_same(_bag(vt, raw))
