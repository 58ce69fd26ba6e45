"""A Java serialization writer: the stream `ObjectOutputStream` writes, for the classes OpenJMS
messages hold (Externalizable classes, boxed primitives, String, byte[], HashMap).

Byte-exact with the JDK where it matters for a reader: block data is cut into 1024-byte
segments at arbitrary byte positions and flushed before a nested object (BlockDataOutputStream),
class descriptors and objects get handles in write order, and an object (or descriptor) written
twice becomes a back-reference. Object identity is by value here: equal strings and equal
destinations are written once and referred to after, as OpenJMS's own objects are when shared.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from bridge.codecs.javaser import (
    SC_BLOCK_DATA,
    SC_EXTERNALIZABLE,
    SC_SERIALIZABLE,
    SC_WRITE_METHOD,
    TC_ARRAY,
    TC_BLOCKDATA,
    TC_BLOCKDATALONG,
    TC_CLASSDESC,
    TC_ENDBLOCKDATA,
    TC_LONGSTRING,
    TC_NULL,
    TC_OBJECT,
    TC_REFERENCE,
    TC_STRING,
)

MAGIC = b"\xac\xed\x00\x05"
BASE_HANDLE = 0x7E0000
MAX_BLOCK = 1024


@dataclass(frozen=True)
class Desc:
    """A class descriptor as it goes on the wire."""

    name: str
    suid: int
    flags: int
    fields: tuple[tuple[str, str], ...] = ()  # (type code, name), primitives only
    superclass: Desc | None = None


def externalizable(name: str, suid: int, superclass: Desc | None = None) -> Desc:
    return Desc(name, suid, SC_EXTERNALIZABLE | SC_BLOCK_DATA, (), superclass)


NUMBER = Desc("java.lang.Number", -8742448824652078965, SC_SERIALIZABLE)
BOXES: dict[str, tuple[Desc, str]] = {  # class -> (descriptor, struct code of its `value`)
    "java.lang.Boolean": (Desc("java.lang.Boolean", -3665804199014368530, SC_SERIALIZABLE, (("Z", "value"),)), "?"),
    "java.lang.Byte": (Desc("java.lang.Byte", -7183698231559129828, SC_SERIALIZABLE, (("B", "value"),), NUMBER), "b"),
    "java.lang.Character": (Desc("java.lang.Character", 3786198910865385080, SC_SERIALIZABLE, (("C", "value"),)), "H"),
    "java.lang.Short": (Desc("java.lang.Short", 7515723908773894738, SC_SERIALIZABLE, (("S", "value"),), NUMBER), "h"),
    "java.lang.Integer": (Desc("java.lang.Integer", 1360826667806852920, SC_SERIALIZABLE, (("I", "value"),), NUMBER), "i"),
    "java.lang.Long": (Desc("java.lang.Long", 4290774380558885855, SC_SERIALIZABLE, (("J", "value"),), NUMBER), "q"),
    "java.lang.Float": (Desc("java.lang.Float", -2671257302660747028, SC_SERIALIZABLE, (("F", "value"),), NUMBER), "f"),
    "java.lang.Double": (Desc("java.lang.Double", -9172774392245257468, SC_SERIALIZABLE, (("D", "value"),), NUMBER), "d"),
}
BYTE_ARRAY = Desc("[B", -5984413125824719648, SC_SERIALIZABLE)
HASHMAP = Desc("java.util.HashMap", 362498820763181265, SC_SERIALIZABLE | SC_WRITE_METHOD, (("F", "loadFactor"), ("I", "threshold")))


def mutf8(text: str) -> bytes:
    """Java's modified UTF-8: U+0000 as C0 80, characters beyond the BMP as two 3-byte surrogates,
    and a lone surrogate (which a Java String may hold, and javaser reads back) as its own 3 bytes."""
    out = bytearray()
    units = text.encode("utf-16-be", "surrogatepass")
    for unit in struct.unpack(f">{len(units) // 2}H", units):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            out += bytes((0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F))
    return bytes(out)


def java_string_hash(text: str) -> int:
    h = 0
    for unit in struct.unpack(f">{len(text.encode('utf-16-be')) // 2}H", text.encode("utf-16-be")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h


def hashmap_layout(keys: list[str]) -> tuple[int, int, list[str]]:
    """(capacity, threshold, iteration order) of a `new HashMap()` after putting `keys` in order,
    as java.util.HashMap (JDK 8+) iterates it: by bucket, then insertion order within one."""
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key)
        return (h ^ (h >> 16)) & (capacity - 1)

    # An empty `new HashMap()` has no table yet: its threshold field is still 0.
    return capacity, (capacity * 3 // 4) if keys else 0, sorted(keys, key=bucket)


class Writer:
    """One ObjectOutputStream."""

    def __init__(self) -> None:
        self.out = bytearray(MAGIC)
        self.block: bytearray | None = None  # primitive data waiting to become block segments
        self.handles: dict[Hashable, int] = {}

    # -- primitive data ----------------------------------------------------------------------
    def raw(self, data: bytes) -> None:
        if self.block is None:
            self.out += data
            return
        view = memoryview(data)
        while view:
            if len(self.block) >= MAX_BLOCK:
                self._drain()
            room = MAX_BLOCK - len(self.block)
            self.block += view[:room]
            view = view[room:]

    def pack(self, fmt: str, *values: Any) -> None:
        self.raw(struct.pack(">" + fmt, *values))

    def utf(self, text: str) -> None:
        data = mutf8(text)
        self.pack("H", len(data))
        self.raw(data)

    def chars(self, text: str) -> None:
        """`int n` then n UTF-16 code units, as OpenJMS writes names and types."""
        data = text.encode("utf-16-be", "surrogatepass")  # Java writes a lone surrogate as it is
        self.pack("i", len(data) // 2)
        self.raw(data)

    def _drain(self) -> None:
        if self.block:
            n = len(self.block)
            self.out += bytes((TC_BLOCKDATA, n)) if n <= 255 else bytes((TC_BLOCKDATALONG,)) + struct.pack(">i", n)
            self.out += self.block
        self.block = bytearray() if self.block is not None else None

    def _block_mode(self, on: bool) -> bool:
        was = self.block is not None
        if was and not on:
            self._drain()
            self.block = None
        elif on and not was:
            self.block = bytearray()
        return was

    # -- objects -----------------------------------------------------------------------------
    def _ref(self, key: Hashable) -> bool:
        handle = self.handles.get(key)
        if handle is None:
            return False
        self.out += bytes((TC_REFERENCE,)) + struct.pack(">i", handle)
        return True

    def _assign(self, key: Hashable | None) -> None:
        h = BASE_HANDLE + len(self.handles) + getattr(self, "_anonymous", 0)
        if key is None:
            self._anonymous = getattr(self, "_anonymous", 0) + 1
        else:
            self.handles[key] = h

    def obj(self, write: Callable[[], None]) -> None:
        """Writes a nested object the way writeObject does inside block data: flush, object, resume."""
        was = self._block_mode(False)
        write()
        self._block_mode(was)

    def null(self) -> None:
        self.obj(lambda: self.out.append(TC_NULL))

    def string(self, text: str | None) -> None:
        if text is None:
            return self.null()

        def write() -> None:
            if self._ref(("str", text)):
                return
            data = mutf8(text)
            self.out += (bytes((TC_STRING,)) + struct.pack(">H", len(data)) if len(data) <= 0xFFFF
                         else bytes((TC_LONGSTRING,)) + struct.pack(">q", len(data))) + data
            self._assign(("str", text))
        self.obj(write)

    def desc(self, d: Desc | None) -> None:
        if d is None:
            self.out.append(TC_NULL)
            return
        if self._ref(("desc", d.name)):
            return
        self.out.append(TC_CLASSDESC)
        data = mutf8(d.name)
        self.out += struct.pack(">H", len(data)) + data + struct.pack(">q", d.suid)
        self._assign(("desc", d.name))
        self.out += bytes((d.flags,)) + struct.pack(">h", len(d.fields))
        for code, name in d.fields:
            data = mutf8(name)
            self.out += code.encode() + struct.pack(">H", len(data)) + data
        self.out.append(TC_ENDBLOCKDATA)  # no class annotation
        self.desc(d.superclass)

    def external(self, d: Desc, payload: Callable[[], None], identity: Hashable | None = None) -> None:
        """An Externalizable object: its writeExternal payload as block data, then the end marker."""
        def write() -> None:
            if identity is not None and self._ref(identity):
                return
            self.out.append(TC_OBJECT)
            self.desc(d)
            self._assign(identity)
            self._block_mode(True)
            payload()
            self._block_mode(False)
            self.out.append(TC_ENDBLOCKDATA)
        self.obj(write)

    def boxed(self, java_class: str, value: Any) -> None:
        d, code = BOXES[java_class]

        def write() -> None:
            self.out.append(TC_OBJECT)
            self.desc(d)
            self._assign(None)
            self.out += struct.pack(">" + code, ord(value) if code == "H" else value)
        self.obj(write)

    def byte_array(self, data: bytes) -> None:
        def write() -> None:
            self.out.append(TC_ARRAY)
            self.desc(BYTE_ARRAY)
            self._assign(None)
            self.out += struct.pack(">i", len(data)) + data
        self.obj(write)

    def hashmap(self, entries: dict[str, Callable[[], None]]) -> None:
        """A java.util.HashMap of String keys; each value is written by its callable."""
        capacity, threshold, order = hashmap_layout(list(entries))

        def write() -> None:
            self.out.append(TC_OBJECT)
            self.desc(HASHMAP)
            self._assign(None)
            self.out += struct.pack(">fi", 0.75, threshold)
            self._block_mode(True)
            self.pack("ii", capacity, len(entries))
            for key in order:
                self.string(key)
                entries[key]()
            self._block_mode(False)
            self.out.append(TC_ENDBLOCKDATA)
        self.obj(write)

    def top(self, write: Callable[[], None]) -> bytes:
        write()
        return bytes(self.out)
