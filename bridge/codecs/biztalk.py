"""BizTalk MessageBox blobs: `Spool.imgContext` property bags and `Parts`/`Fragments` block streams.

Layouts: shared/fixtures/biztalk/README.md (newer than reference/legacy-sources.md §3.6-3.7):
context C4 (namespace-grouped, ordinary messages) and D4 (flat `Name^Namespace`, seen on engine
control messages), VARIANT values, and zlib block streams per fragment.
"""

from __future__ import annotations

import codecs
import functools
import struct
import zlib
from collections.abc import Callable
from typing import Any

from bridge.codecs.biztalk_values import (
    CLSID_C4,
    CLSID_D4,
    ERROR_NS,
    MAX_BLOCK,
    MAX_ITEMS,
    SYSTEM_NS,
    VT_ARRAY,
    BizTalkFormatError,
    ContextProperty,
    currency,
    ole_date,
)
from bridge.codecs.compiled import compiled, tell_missing

# biztalk_native.decode_context when it was built: the same answers for a bag that follows the layout, None for any other.
COMPILED_CONTEXT: Callable[[bytes], tuple[str, list[ContextProperty]] | None] | None = compiled("biztalk_native", "decode_context")
# (headers, the system MessageType, the error report's MessageType, the InterchangeID): context_fields
ContextFields = tuple[dict[str, str], Any, Any, Any]
# biztalk_native.context_fields: the same answers as context_fields_python for such a bag, None for any other.
COMPILED_FIELDS: Callable[..., ContextFields | None] | None = compiled("biztalk_native", "context_fields")
# biztalk_native.decode_blocks: the same bytes as decode_blocks_python for a fragment that follows the layout, None for any other.
COMPILED_BLOCKS: Callable[[bytes], bytes | None] | None = compiled("biztalk_native", "decode_blocks")

# VARTYPE -> (struct format, size); strings and special cases are handled apart.
_SCALARS = {
    2: ("<h", 2), 3: ("<i", 4), 4: ("<f", 4), 5: ("<d", 8), 10: ("<i", 4), 16: ("<b", 1), 17: ("<B", 1),
    18: ("<H", 2), 19: ("<I", 4), 20: ("<q", 8), 21: ("<Q", 8), 22: ("<i", 4), 23: ("<I", 4),
}
VT_NAMES = {0: "VT_EMPTY", 1: "VT_NULL", 2: "VT_I2", 3: "VT_I4", 4: "VT_R4", 5: "VT_R8", 6: "VT_CY", 7: "VT_DATE",
            8: "VT_BSTR", 10: "VT_ERROR", 11: "VT_BOOL", 14: "VT_DECIMAL", 16: "VT_I1", 17: "VT_UI1", 18: "VT_UI2",
            19: "VT_UI4", 20: "VT_I8", 21: "VT_UI8", 22: "VT_INT", 23: "VT_UINT"}


class _Cursor:
    """Reads a blob front to back. Values are unpacked in place with precompiled structs: one
    context bag holds dozens of properties, and every message's bag is read (issue 37)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.size = len(data)

    def _advance(self, n: int) -> int:
        """Moves past the next `n` bytes and returns where they start."""
        pos = self.pos
        if n < 0 or pos + n > self.size:
            raise BizTalkFormatError(f"truncated: needs {n} bytes at offset {pos}, {self.size - pos} left")
        self.pos = pos + n
        return pos

    def take(self, n: int) -> bytes:
        pos = self._advance(n)
        return self.data[pos:pos + n]

    def unpack(self, fmt: str, n: int) -> Any:
        return _struct(fmt).unpack_from(self.data, self._advance(n))[0]

    def i32(self) -> int:
        return _I32(self.data, self._advance(4))[0]

    def count(self, what: str) -> int:
        n = self.i32()
        if n < 0 or n > MAX_ITEMS or n > self.size - self.pos:
            raise BizTalkFormatError(f"{what} count {n} at offset {self.pos - 4} is impossible for a {self.size}-byte bag")
        return n

    def string(self) -> str:
        """int32 byte length (including the 2-byte NUL), UTF-16LE, NUL."""
        n = self.i32()
        pos = self.pos
        if n < 2 or n % 2 or n > self.size - pos:
            raise BizTalkFormatError(f"string length {n} at offset {pos - 4} is invalid")
        end = pos + n
        data = self.data
        if data[end - 2] or data[end - 1]:
            raise BizTalkFormatError(f"string at offset {pos} is not NUL-terminated")
        self.pos = end
        return _utf16(data[pos:end - 2], "surrogatepass", True)[0]


_I32 = struct.Struct("<i").unpack_from
# bytes.decode("utf-16-le") goes through the codec's Python wrapper; its C function does not.
_utf16 = codecs.utf_16_le_decode


@functools.lru_cache(maxsize=32)
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct(fmt)


def _scalar(c: _Cursor, vt: int) -> Any:
    if vt in (8, 14):  # BSTR; DECIMAL is stored as its text
        return c.string()
    if vt == 11:
        return c.unpack("<h", 2) != 0
    if vt == 7:
        return ole_date(c.unpack("<d", 8))
    if vt == 6:
        return currency(c.unpack("<q", 8))
    if vt in (0, 1):
        return None
    if vt in _SCALARS:
        fmt, n = _SCALARS[vt]
        return c.unpack(fmt, n)
    raise BizTalkFormatError(f"unknown property type VARTYPE {vt} at offset {c.pos - 2}")


def _value(c: _Cursor) -> tuple[int, bool, Any]:
    is_array = c.unpack("<B", 1)
    raw_vt = c.unpack("<H", 2)
    if is_array not in (0, 1) or bool(is_array) != bool(raw_vt & VT_ARRAY):
        raise BizTalkFormatError(f"value at offset {c.pos - 3}: array flag {is_array} disagrees with VARTYPE {raw_vt:#06x}")
    vt = raw_vt & ~VT_ARRAY
    if not is_array:
        return vt, False, _scalar(c, vt)
    dims = c.unpack("<H", 2)
    if not 1 <= dims <= 8:
        raise BizTalkFormatError(f"array with {dims} dimensions at offset {c.pos - 2}")
    total = 1
    for _ in range(dims):
        total *= c.count("array element")
        c.i32()  # lower bound
        if total > MAX_ITEMS:
            raise BizTalkFormatError("array too large")
    return vt, True, [_scalar(c, vt) for _ in range(total)]


def decode_context(blob: bytes) -> tuple[str, list[ContextProperty]]:
    """(layout, properties in stored order) of an imgContext blob; BizTalkFormatError saying why not."""
    if COMPILED_CONTEXT is None:
        tell_missing("biztalk_native", "BizTalk context bags")
    else:
        got = COMPILED_CONTEXT(blob)
        if got is not None:
            return got
    return decode_context_python(blob)


def context_fields(blob: bytes, names: dict[str, dict[str, str]], name_of: Callable[[str, str], str],
                   text_of: Callable[[Any], str], memo: list[Any] | None = None) -> ContextFields:
    """What a message takes from its bag: (headers, the system MessageType, the error report's
    MessageType, the InterchangeID); BizTalkFormatError saying why not. A header is each written,
    promoted or was-promoted property, named by `names[namespace][property]` or else by
    `name_of(namespace, property)`, its value as it is where it is a str, else `text_of(value)`;
    a property that comes again overwrites (its header keeps its first place). `memo`: the
    compiled reader's memory of the last bag's strings, the caller's to keep (empty at first, and
    anew whenever the names `names` and `name_of` give change)."""
    if COMPILED_FIELDS is not None:
        got = COMPILED_FIELDS(blob, names, name_of, text_of, memo)
        if got is not None:
            return got
    return context_fields_python(blob, names, name_of, text_of)


def context_fields_python(blob: bytes, names: dict[str, dict[str, str]], name_of: Callable[[str, str], str],
                          text_of: Callable[[Any], str]) -> ContextFields:
    """context_fields from decode_context's properties: the reference the compiled one is held to."""
    _, props = decode_context(blob)
    ctx = {(p.namespace, p.name): p.value for p in props}
    headers: dict[str, str] = {}
    for p in props:
        if p.context_property_type & (1 | 2 | 16):  # written, promoted, was-promoted
            space = names.get(p.namespace)
            name = None if space is None else space.get(p.name)
            if name is None:
                name = name_of(p.namespace, p.name)
            headers[name] = p.value if type(p.value) is str else text_of(p.value)
    return (headers, ctx.get((SYSTEM_NS, "MessageType")), ctx.get((ERROR_NS, "MessageType")),
            ctx.get((SYSTEM_NS, "InterchangeID")))


def decode_context_python(blob: bytes) -> tuple[str, list[ContextProperty]]:
    """decode_context by the pure-Python reader: the reference the compiled one is held to, and
    the one that words what is wrong with a bag."""
    c = _Cursor(bytes(blob))
    clsid = c.take(16)
    props: list[ContextProperty] = []
    if clsid == CLSID_C4:
        for _ in range(c.count("namespace")):
            namespace = c.string()
            for _ in range(c.count("property")):
                name = c.string()
                ptype = c.i32()
                vt, is_array, value = _value(c)
                props.append(ContextProperty(name, namespace, vt, ptype, is_array, value))
        layout = "C4"
    elif clsid == CLSID_D4:
        for _ in range(c.count("property")):
            prefix = c.i32()
            key = c.string()
            ptype = c.i32()
            vt, is_array, value = _value(c)
            name, sep, namespace = key.partition("^")
            if sep and prefix != len(name.encode("utf-16-le")) // 2:
                raise BizTalkFormatError(f"D4 key {key[:60]!r}: prefix {prefix} does not match the local name")
            props.append(ContextProperty(name, namespace, vt, ptype, is_array, value))
        layout = "D4"
    else:
        raise BizTalkFormatError(f"not a BizTalk context: CLSID {clsid.hex().upper()} is neither C4 nor D4")
    if c.pos != len(c.data):
        raise BizTalkFormatError(f"{len(c.data) - c.pos} bytes left after the last property")
    return layout, props


def decode_blocks(blob: bytes) -> bytes:
    """One fragment's block stream: (compressed, uncompressed length, stored length, bytes)... (0,0,0);
    BizTalkFormatError saying why not."""
    if COMPILED_BLOCKS is not None:
        got = COMPILED_BLOCKS(blob)
        if got is not None:
            return got
    return decode_blocks_python(blob)


def decode_blocks_python(blob: bytes) -> bytes:
    """decode_blocks by the pure-Python reader: the reference the compiled one is held to, and
    what words the error of a fragment the compiled one declines."""
    data = bytes(blob)
    if not data:
        return b""  # DtaSpy's writer stores an empty part as no bytes at all
    c = _Cursor(data)
    out = bytearray()
    while True:
        flag, size, stored = struct.unpack("<iii", c.take(12))
        if (flag, size, stored) == (0, 0, 0):
            break
        if flag not in (0, 1) or not 0 < size <= MAX_BLOCK or not 0 < stored <= MAX_BLOCK:
            raise BizTalkFormatError(f"bad block header ({flag}, {size}, {stored}) at offset {c.pos - 12}")
        chunk = c.take(stored)
        if flag == 1:
            try:
                z = zlib.decompressobj()
                chunk = z.decompress(chunk, size + 1)
            except zlib.error as e:
                raise BizTalkFormatError(f"compressed block at offset {c.pos - stored - 12}: {e}") from None
            if not z.eof:
                raise BizTalkFormatError(f"compressed block at offset {c.pos - stored - 12} inflates past its stated {size} bytes or ends early")
        if len(chunk) != size:
            raise BizTalkFormatError(f"block at offset {c.pos - stored - 12} holds {len(chunk)} bytes, header says {size}")
        out += chunk
    if c.pos != len(data):
        raise BizTalkFormatError(f"{len(data) - c.pos} bytes after the end-of-stream block")
    return bytes(out)


def decode_part(fragments: list[bytes], part_size: int | None = None) -> bytes:
    """A whole part: each fragment decoded on its own, concatenated in fragment order.

    A single fragment exactly `part_size` bytes long is taken as raw, unframed data, as the
    TechNet 54330 script does (DATALENGTH(imgPart) == nPartSize); framing adds at least 12 bytes.
    """
    if part_size and len(fragments) == 1 and len(fragments[0]) == part_size:
        return bytes(fragments[0])
    body = decode_blocks(fragments[0]) if len(fragments) == 1 else b"".join(decode_blocks(f) for f in fragments)
    if part_size is not None and len(body) != part_size:
        raise BizTalkFormatError(f"part decodes to {len(body)} bytes but Parts.nPartSize says {part_size}")
    return body
