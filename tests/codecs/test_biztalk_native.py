"""The compiled BizTalk context reader (biztalk_native, issue 49) against the pure-Python one it
stands in for (biztalk.decode_context_python): on every golden bag, on bags hypothesis writes in
both layouts with every VARTYPE, scalars and arrays, and on mutations of both, it gives the very
same answer (types too: a bool is not an int) or None, and None only where the Python reader
refuses the bag; `decode_context` then gives the Python reader's answer or its error."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs import biztalk
from bridge.codecs.biztalk import BizTalkFormatError, context_fields_python, decode_context, decode_context_python
from bridge.codecs.biztalk_values import CLSID_C4, CLSID_D4, ERROR_NS, SYSTEM_NS, VT_ARRAY
from bridge.sources.biztalk import header_text

HERE = Path(__file__).parents[1] / "fixtures" / "biztalk"
BAGS = sorted(p for p in HERE.glob("*ctx*.bin"))


def test_the_compiled_reader_is_built_and_used() -> None:
    assert biztalk.COMPILED_CONTEXT is not None, "bridge.codecs.biztalk_native was not built: pip install -e . with gcc"
    assert biztalk.COMPILED_FIELDS is not None


def _fields(read: object, blob: bytes) -> tuple[object, dict]:
    """(what `read` makes of the bag's fields, the header names it left known), from a names
    store that knows one name already and a namer that keeps what it names, as BizTalkSource's do."""
    names = {SYSTEM_NS: {"MessageType": "BTS.MessageType"}}

    def name_of(namespace: str, name: str) -> str:
        header = f"{namespace[-3:]}.{name}"
        names.setdefault(namespace, {})[name] = header
        return header

    return read(blob, names, name_of, header_text), names  # type: ignore[operator]


def same_fields(blob: bytes, reads: bool) -> None:
    """The compiled context_fields against the Python one: the same headers (order, values and
    their types), picked values and names, where the bag reads; a decline where it does not."""
    try:
        slow, slow_names = _fields(context_fields_python, blob)
    except TypeError as e:  # a value header_text cannot spell (a list holding a lone surrogate): the same error
        assert reads
        with pytest.raises(TypeError) as refused:
            _fields(biztalk.COMPILED_FIELDS, blob)
        assert str(refused.value) == str(e)
        return
    except (BizTalkFormatError, UnicodeEncodeError):
        assert not reads
    fast, fast_names = _fields(biztalk.COMPILED_FIELDS, blob)
    if not reads:
        assert fast is None
        return
    assert fast is not None, "the compiled fields declined a bag the Python reader reads"
    assert repr(fast) == repr(slow) and list(fast[0]) == list(slow[0])
    assert [type(v) for v in fast[0].values()] == [type(v) for v in slow[0].values()]
    assert [type(v) for v in fast[1:]] == [type(v) for v in slow[1:]]
    assert fast_names == slow_names


def same_or_declined(blob: bytes) -> object:
    """The compiled answer, checked against the Python reader's: the same, or None where it refuses."""
    assert biztalk.COMPILED_CONTEXT is not None
    fast = biztalk.COMPILED_CONTEXT(blob)
    try:
        slow = decode_context_python(blob)
    except BizTalkFormatError as e:
        assert fast is None, "the compiled reader read a bag the Python reader refuses"
        with pytest.raises(BizTalkFormatError) as refused:
            decode_context(blob)
        assert str(refused.value) == str(e)
        same_fields(blob, reads=False)
        return None
    except UnicodeEncodeError:  # a D4 key with a lone surrogate: the Python reader's own error
        assert fast is None
        same_fields(blob, reads=False)
        return None
    assert fast is not None, "the compiled reader declined a bag the Python reader reads"
    assert repr(fast) == repr(slow)
    assert all(type(p) is type(q) for p, q in zip(fast[1], slow[1]))
    same_fields(blob, reads=True)
    return fast


@pytest.mark.parametrize("path", BAGS, ids=[p.name for p in BAGS])
def test_every_golden_bag_reads_alike(path: Path) -> None:
    assert same_or_declined(path.read_bytes()) is not None


# -- bags written here, in both layouts ------------------------------------------------------------
def _string(text: str) -> bytes:
    raw = text.encode("utf-16-le", "surrogatepass") + b"\0\0"
    return struct.pack("<i", len(raw)) + raw


_SCALAR = {2: "<h", 3: "<i", 4: "<f", 5: "<d", 6: "<q", 7: "<d", 10: "<i", 11: "<h", 16: "<b", 17: "<B", 18: "<H",
           19: "<I", 20: "<q", 21: "<Q", 22: "<i", 23: "<I"}
_RANGES = {"<h": (-2**15, 2**15 - 1), "<i": (-2**31, 2**31 - 1), "<q": (-2**63, 2**63 - 1), "<b": (-128, 127),
           "<B": (0, 255), "<H": (0, 2**16 - 1), "<I": (0, 2**32 - 1), "<Q": (0, 2**64 - 1)}
_text = st.text(st.one_of(st.characters(exclude_characters="\0"), st.characters(categories=["Cs"])), max_size=20)
# names and namespaces that context_fields picks values by, or names from its names store
_named = st.one_of(_text, st.sampled_from([SYSTEM_NS, ERROR_NS, "MessageType", "InterchangeID"]))


@st.composite
def _payload(draw: st.DrawFn, vt: int) -> bytes:
    if vt in (8, 14):
        return _string(draw(_text))
    if vt in (0, 1):
        return b""
    fmt = _SCALAR[vt]
    if vt == 7:  # an OLE date, in range or just past it
        return struct.pack(fmt, draw(st.one_of(st.floats(-700_000, 2_958_470), st.just(float("nan")))))
    if fmt in ("<f", "<d"):
        return struct.pack(fmt, draw(st.floats(allow_nan=True, allow_infinity=True, width=32 if fmt == "<f" else 64)))
    return struct.pack(fmt, draw(st.integers(*_RANGES[fmt])))


@st.composite
def _value(draw: st.DrawFn) -> bytes:
    vt = draw(st.sampled_from([0, 1, *_SCALAR, 8, 14]))
    if not draw(st.booleans()):
        return bytes([0]) + struct.pack("<H", vt) + draw(_payload(vt))
    dims = draw(st.lists(st.integers(0, 3), min_size=1, max_size=2))
    head = struct.pack("<H", len(dims)) + b"".join(struct.pack("<ii", n, 0) for n in dims)
    total = 1
    for n in dims:
        total *= n
    return bytes([1]) + struct.pack("<H", vt | VT_ARRAY) + head + b"".join(draw(_payload(vt)) for _ in range(total))


_ptype = st.sampled_from([1, 2, 4, 16, 0, 3])


@st.composite
def c4_bags(draw: st.DrawFn) -> bytes:
    spaces = draw(st.lists(st.tuples(_named, st.lists(st.tuples(_named, _ptype, _value()), max_size=6)), max_size=4))
    out = CLSID_C4 + struct.pack("<i", len(spaces))
    for namespace, props in spaces:
        out += _string(namespace) + struct.pack("<i", len(props))
        for name, ptype, value in props:
            out += _string(name) + struct.pack("<i", ptype) + value
    return out


@st.composite
def d4_bags(draw: st.DrawFn) -> bytes:
    props = draw(st.lists(st.tuples(_named, st.one_of(st.none(), _named), _ptype, _value(), st.booleans()), max_size=8))
    out = CLSID_D4 + struct.pack("<i", len(props))
    for name, namespace, ptype, value, right_prefix in props:
        key = name if namespace is None else f"{name}^{namespace}"
        units = len(name.encode("utf-16-le", "surrogatepass")) // 2
        prefix = 0 if namespace is None else units if right_prefix else units + 1
        out += struct.pack("<i", prefix) + _string(key) + struct.pack("<i", ptype) + value
    return out


_bags = st.one_of(c4_bags(), d4_bags())


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_bags)
def test_bags_of_every_type_in_both_layouts_read_alike(blob: bytes) -> None:
    same_or_declined(blob)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.one_of(_bags, st.sampled_from(BAGS).map(Path.read_bytes))))
    for _ in range(draw(st.integers(1, 3))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.sampled_from([0x00, 0x01, 0x02, 0x20, 0x7F, 0x80, 0xFE, 0xFF, draw(st.integers(0, 255))]))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut] if draw(st.booleans()) else data)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_and_cut_bags_read_alike_or_decline(blob: bytes) -> None:
    same_or_declined(blob)


# -- the memo: what the compiled reader knew of the last bag's strings ---------------------------------
@st.composite
def _bag_runs(draw: st.DrawFn) -> list[bytes]:
    """A queue's bags as a memo meets them: a C4 bag, again, and changed here and there (a byte of
    a name, a namespace, a value; cut short), in any order."""
    base = draw(st.one_of(c4_bags(), st.sampled_from([p for p in BAGS if "d4" not in p.name and "real_ctx" not in p.name])
                          .map(Path.read_bytes)))
    out = []
    for _ in range(draw(st.integers(2, 6))):
        data = bytearray(base)
        if data and draw(st.booleans()):
            for _ in range(draw(st.integers(1, 2))):
                data[draw(st.integers(16, max(16, len(data) - 1))) % len(data)] = draw(st.integers(0, 255))
            if draw(st.booleans()):
                data = data[:draw(st.integers(0, len(data)))]
        out.append(bytes(data))
    return out


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_bag_runs())
def test_a_memo_kept_from_bag_to_bag_reads_each_as_the_python_reader_does(blobs: list[bytes]) -> None:
    assert biztalk.COMPILED_FIELDS is not None
    memo: list = []
    names_fast: dict = {SYSTEM_NS: {"MessageType": "BTS.MessageType"}}
    names_slow: dict = {SYSTEM_NS: {"MessageType": "BTS.MessageType"}}

    def namer(names: dict):
        def name_of(namespace: str, name: str) -> str:
            header = f"{namespace[-3:]}.{name}"
            names.setdefault(namespace, {})[name] = header
            return header
        return name_of

    for blob in blobs:
        try:
            slow = context_fields_python(blob, names_slow, namer(names_slow), header_text)
        except (BizTalkFormatError, UnicodeEncodeError, TypeError):
            slow = None
        try:
            fast = biztalk.COMPILED_FIELDS(blob, names_fast, namer(names_fast), header_text, memo)
        except TypeError:  # a value header_text cannot spell: the Python reader raised it too
            assert slow is None
            continue
        if slow is None:
            assert fast is None
            continue
        assert fast is not None, "the compiled fields declined a bag the Python reader reads"
        assert repr(fast) == repr(slow) and list(fast[0]) == list(slow[0])
        assert [type(v) for v in fast[0].values()] == [type(v) for v in slow[0].values()]
        assert [type(v) for v in fast[1:]] == [type(v) for v in slow[1:]]
    assert len(memo) <= 512


def test_the_memo_remembers_the_names_of_a_bag_and_answers_the_same_again() -> None:
    blob = (HERE / "ctx_receive.bin").read_bytes()
    names: dict = {}
    calls: list = []

    def name_of(namespace: str, name: str) -> str:
        calls.append(name)
        return f"{namespace[-3:]}.{name}"

    memo: list = []
    assert biztalk.COMPILED_FIELDS is not None
    first = biztalk.COMPILED_FIELDS(blob, names, name_of, header_text, memo)
    named = len(calls)
    again = biztalk.COMPILED_FIELDS(blob, names, name_of, header_text, memo)
    assert first == again == context_fields_python(blob, {}, name_of, header_text)
    assert named == 28 and len(calls) == 28 + 28, "the second bag's names came from the memo, not name_of"
    assert len(memo) == 6 + 28  # its namespaces and names, in the bag's order
