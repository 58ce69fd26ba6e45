"""A single-pass reader of Java serialization streams whose layout the caller knows: the walk
under openjms_fast, the fast path of the OpenJMS messageBlob reader.

The generic reader (javaser) builds every class descriptor, object and block of a stream before
anything interprets it. This one reads objects where the caller's layout expects them, straight
from the bytes with precompiled structs, and keeps every class descriptor it has parsed under
its exact bytes: each blob of a store repeats the same descriptors, so after the first they
cost one comparison. Of the JDK's classes it reads String, byte[], the boxed primitives and
HashMap, each only in the shape the JDK writes; externalizable classes are read by the
subclass's EXTERNAL readers, along their writeExternal layouts.

Wherever it could read something other than what javaser reads it raises `Decline` (or an
IndexError, struct.error or ValueError from a cut stream) instead: it is stricter, never looser.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, ClassVar

from bridge.codecs.javaser import (
    BASE_HANDLE,
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
    mutf8,
)

EXTERNAL_FLAGS = SC_EXTERNALIZABLE | SC_BLOCK_DATA
_PRIMITIVE_CODES = frozenset(b"BCDFIJSZ")
CACHE_LIMIT = 1024  # class descriptors and chains remembered across blobs; a real store has a few dozen

long_at = struct.Struct(">q").unpack_from
int_at = struct.Struct(">i").unpack_from
_H = struct.Struct(">H").unpack_from
_h = struct.Struct(">h").unpack_from


class Decline(Exception):
    """Not the layout this reader knows: the generic reader decides."""


# Tags of what a handle holds: (tag, value). A class descriptor's handle holds (None, chain,
# kind), which matches no tag, so a back-reference to a descriptor where an object belongs is
# declined; an object still being read holds PENDING, so a reference into it (a cycle) is too.
BOXED, BYTES, MAP = "boxed", "byte[]", "map"
PENDING = object()
READ_MAP = object()  # the kind of a java.util.HashMap chain


class _Desc:
    """One class descriptor, without its superclass (that is per stream)."""

    __slots__ = ("fields", "flags", "name")

    def __init__(self, name: str, flags: int, fields: tuple[tuple[str, str], ...]) -> None:
        self.name, self.flags, self.fields = name, flags, fields


class Known:
    """A descriptor seen before, under the bytes of its name, suid, flags and field count."""

    __slots__ = ("desc", "tail", "under", "whole")

    def __init__(self, desc: _Desc, tail: bytes) -> None:
        self.desc, self.tail = desc, tail  # tail: its fields and the end of its class annotation
        # (tail and every superclass descriptor, the chain's entry, the handles they take) once
        # seen with all superclasses new; one attribute, so that a thread never sees half of it.
        self.whole: tuple[bytes, tuple[None, tuple[_Desc, ...], Any], list[Any]] | None = None
        self.under: list[tuple[Any, Any]] = []  # (superclass's entry, this chain's entry), superclass back-referenced


DESCS: dict[bytes, Known] = {}
KINDS: dict[tuple[_Desc, ...], Any] = {}  # chain -> how an object of it is read


class Walker:
    """One stream. Subclasses name their externalizable classes' payload readers in EXTERNAL;
    each gets the walker at the object's block data and leaves it at the end marker."""

    EXTERNAL: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    __slots__ = ("data", "end", "handles", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.end = len(data)
        self.pos = 0
        self.handles: list[Any] = []

    # -- block data ------------------------------------------------------------------------
    def segment(self) -> tuple[bytes, int, int]:
        """The primitive data up to the next object: consecutive block-data segments joined,
        as (buffer, start, end); a lone segment is read in place."""
        data, pos = self.data, self.pos
        tc = data[pos]
        if tc == TC_BLOCKDATA:
            start = pos + 2
            end = start + data[pos + 1]
        elif tc == TC_BLOCKDATALONG:
            start = pos + 5
            end = start + int_at(data, pos + 1)[0]
            if end < start:
                raise Decline
        else:
            raise Decline
        if end >= self.end:  # a payload always ends with its end marker
            raise Decline
        if data[end] == TC_BLOCKDATA or data[end] == TC_BLOCKDATALONG:
            return self._joined(start, end)
        self.pos = end
        return data, start, end

    def _joined(self, start: int, end: int) -> tuple[bytes, int, int]:
        data = self.data
        parts = [data[start:end]]
        pos = end
        while data[pos] == TC_BLOCKDATA or data[pos] == TC_BLOCKDATALONG:
            if data[pos] == TC_BLOCKDATA:
                start, end = pos + 2, pos + 2 + data[pos + 1]
            else:
                start = pos + 5
                end = start + int_at(data, pos + 1)[0]
            if end < start or end >= self.end:
                raise Decline
            parts.append(data[start:end])
            pos = end
        self.pos = pos
        joined = b"".join(parts)
        return joined, 0, len(joined)

    def fixed(self, size: int) -> tuple[bytes, int]:
        """A segment of exactly `size` bytes, as (buffer, start)."""
        data, pos = self.data, self.pos
        end = pos + 2 + size
        if (data[pos] == TC_BLOCKDATA and data[pos + 1] == size
                and data[end] != TC_BLOCKDATA and data[end] != TC_BLOCKDATALONG):
            self.pos = end
            return data, pos + 2
        buf, start, end = self.segment()
        if end - start != size:
            raise Decline
        return buf, start

    # -- class descriptors -----------------------------------------------------------------
    def classdesc(self, depth: int = 0) -> tuple[None, tuple[_Desc, ...], Any] | None:
        """The descriptor chain at pos as its handle holds it; None for TC_NULL."""
        data, pos = self.data, self.pos
        tc = data[pos]
        if tc == TC_NULL:
            self.pos = pos + 1
            return None
        if tc == TC_REFERENCE:
            self.pos = pos + 5
            return self._desc_at(pos)
        if tc != TC_CLASSDESC or depth > 8:
            raise Decline
        key_end = pos + 14 + _H(data, pos + 1)[0]  # name length, name, suid, flags, field count
        if key_end > self.end:
            raise Decline
        key = data[pos + 1:key_end]
        known = DESCS.get(key)
        whole = known.whole if known is not None else None
        if whole is not None and data.startswith(whole[0], key_end):
            self.pos = key_end + len(whole[0])
            self.handles.extend(whole[2])
            return whole[1]
        if known is not None and data.startswith(known.tail, key_end):
            desc, tail = known.desc, known.tail
        else:
            desc, tail = parse_desc(data, pos + 1, key_end)
            if known is None and len(DESCS) < CACHE_LIMIT:
                known = DESCS[key] = Known(desc, tail)
            else:
                known = None  # the same name and suid with other fields: read, not remembered
        pos = self.pos = key_end + len(tail)
        handles = self.handles
        index = len(handles)
        handles.append(PENDING)
        if known is not None and data[pos] == TC_REFERENCE:
            # A superclass read before (Number under a second box class): the chain is known by it.
            referenced = self._desc_at(pos)
            for held, entry in known.under:
                if held is referenced:
                    self.pos = pos + 5
                    handles[index] = entry
                    return entry
        superclass = self.classdesc(depth + 1)
        chain = (desc,) if superclass is None else (desc, *superclass[1])
        entry = handles[index] = (None, chain, kind_of(chain))
        if known is not None and known.whole is None and len(handles) - index == len(chain):
            # Every superclass was new here too (no back-reference): next time the chain is one comparison.
            known.whole = data[key_end:self.pos], entry, handles[index:]
        elif known is not None and superclass is not None and len(known.under) < 8:
            known.under.append((superclass, entry))
        return entry

    def _desc_at(self, pos: int) -> tuple[None, tuple[_Desc, ...], Any]:
        handle = int_at(self.data, pos + 1)[0] - BASE_HANDLE
        if not 0 <= handle < len(self.handles):
            raise Decline
        entry = self.handles[handle]
        if type(entry) is not tuple or entry[0] is not None:
            raise Decline
        return entry

    # -- objects ---------------------------------------------------------------------------
    def obj(self) -> Any:
        """The object at pos: None, a str, or (tag, value) for what this reader knows."""
        data, pos = self.data, self.pos
        tc = data[pos]
        if tc == TC_OBJECT:
            if data[pos + 1] == TC_REFERENCE:  # the usual case after a class's first object
                self.pos = pos + 6
                kind = self._desc_at(pos + 1)[2]
            else:
                self.pos = pos + 1
                entry = self.classdesc()
                if entry is None:
                    raise Decline
                kind = entry[2]
            handles = self.handles
            index = len(handles)
            handles.append(PENDING)
            if type(kind) is tuple:  # a boxed primitive
                java_class, unpack, size = kind
                pos = self.pos
                value = unpack(data, pos)[0]
                self.pos = pos + size
                held: Any = (BOXED, (java_class, chr(value) if java_class is CHARACTER else value))
            elif kind is READ_MAP:
                held = MAP, self._hashmap()
            else:  # an externalizable class: its writeExternal payload, then the end of its block data
                reader = self.EXTERNAL.get(kind) if kind is not None else None
                if reader is None:
                    raise Decline
                held = reader(self)
                if data[self.pos] != TC_ENDBLOCKDATA:
                    raise Decline
                self.pos += 1
            handles[index] = held
            return held
        if tc == TC_NULL:
            self.pos = pos + 1
            return None
        if tc == TC_REFERENCE:
            handle = int_at(data, pos + 1)[0] - BASE_HANDLE
            if not 0 <= handle < len(self.handles):
                raise Decline
            self.pos = pos + 5
            return self.handles[handle]
        if tc == TC_STRING:
            start = pos + 3
            end = start + _H(data, pos + 1)[0]
        elif tc == TC_LONGSTRING:
            start = pos + 9
            end = start + long_at(data, pos + 1)[0]
        elif tc == TC_ARRAY:
            self.pos = pos + 1
            return self._array()
        else:
            raise Decline
        if end < start or end > self.end:
            raise Decline
        self.pos = end
        raw = data[start:end]
        text = raw.decode("ascii") if raw.isascii() else mutf8(raw)
        self.handles.append(text)
        return text

    def _hashmap(self) -> dict[str, Any]:
        """java.util.HashMap's writeObject: its two fields, a block (capacity, size), then pairs."""
        data, pos = self.data, self.pos + 8  # loadFactor, threshold: not needed to read it back
        if data[pos] != TC_BLOCKDATA or data[pos + 1] != 8:
            raise Decline
        size = int_at(data, pos + 6)[0]
        if size < 0:
            raise Decline
        self.pos = pos + 10
        entries: dict[str, Any] = {}
        obj = self.obj
        for _ in range(size):
            key = obj()
            if type(key) is not str:
                raise Decline
            entries[key] = obj()
        if data[self.pos] != TC_ENDBLOCKDATA:
            raise Decline
        self.pos += 1
        return entries

    def _array(self) -> tuple[str, bytes]:
        entry = self.classdesc()
        if entry is None or entry[1][0].name != "[B":
            raise Decline
        self.handles.append(PENDING)
        data, pos = self.data, self.pos
        size = int_at(data, pos)[0]
        end = pos + 4 + size
        if size < 0 or end > self.end:
            raise Decline
        self.pos = end
        held = (BYTES, data[pos + 4:end])
        self.handles[-1] = held
        return held

    def text_or_null(self) -> str | None:
        value = self.obj()
        if value is not None and type(value) is not str:
            raise Decline
        return value

    def tagged(self, tag: str) -> Any:
        """The value of an object of kind `tag`, or None for null."""
        value = self.obj()
        if value is None:
            return None
        if type(value) is not tuple or value[0] is not tag:
            raise Decline
        return value[1]


def parse_desc(data: bytes, start: int, key_end: int) -> tuple[_Desc, bytes]:
    """A descriptor's name, flags and primitive fields, and the bytes from its fields through
    the end of its (empty) class annotation."""
    name = mutf8(data[start + 2:key_end - 11])
    count = _h(data, key_end - 2)[0]
    if count < 0:
        raise Decline
    fields = []
    pos = key_end
    for _ in range(count):
        code = data[pos]
        end = pos + 3 + _H(data, pos + 1)[0]
        if code not in _PRIMITIVE_CODES or end > len(data):  # an object field's type string takes a handle
            raise Decline
        fields.append((chr(code), mutf8(data[pos + 3:end])))
        pos = end
    if data[pos] != TC_ENDBLOCKDATA:
        raise Decline
    return _Desc(name, data[key_end - 3], tuple(fields)), data[key_end:pos + 1]


CHARACTER = "java.lang.Character"
_BOXES = {  # class -> (field code, struct of its `value`)
    "java.lang.Boolean": ("Z", ">?"), "java.lang.Byte": ("B", ">b"), "java.lang.Short": ("S", ">h"),
    CHARACTER: ("C", ">H"), "java.lang.Integer": ("I", ">i"), "java.lang.Long": ("J", ">q"),
    "java.lang.Float": ("F", ">f"), "java.lang.Double": ("D", ">d"),
}
_HASHMAP_FIELDS = (("F", "loadFactor"), ("I", "threshold"))


def kind_of(chain: tuple[_Desc, ...]) -> Any:
    """How an object of this class chain is read: the class name of an externalizable class
    (for EXTERNAL), READ_MAP, (class, unpack, size) for a boxed primitive, or None. Of the JDK's
    classes only the shapes the JDK writes are taken, so that reading a HashMap's block or a
    box's one `value` field is what reading every class's fields would give."""
    top = chain[0]
    if top.flags & SC_EXTERNALIZABLE:  # javaser refuses one without block data
        return top.name if top.flags & EXTERNAL_FLAGS == EXTERNAL_FLAGS else None
    if chain in KINDS:
        return KINDS[chain]
    kind: Any = None
    ancestors = chain[1:]
    box = _BOXES.get(top.name)
    if top.name == "java.util.HashMap":
        if not ancestors and top.flags == SC_SERIALIZABLE | SC_WRITE_METHOD and top.fields == _HASHMAP_FIELDS:
            kind = READ_MAP
    elif (box is not None and top.flags == SC_SERIALIZABLE and top.fields == ((box[0], "value"),)
          and all(d.flags == SC_SERIALIZABLE and not d.fields for d in ancestors)):
        unpacker = struct.Struct(box[1])
        kind = next(name for name in _BOXES if name == top.name), unpacker.unpack_from, unpacker.size
    if len(KINDS) < CACHE_LIMIT:
        KINDS[chain] = kind
    return kind


