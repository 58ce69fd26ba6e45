"""A bounded reader of the Java Object Serialization Stream Protocol (version 5).

It builds plain Python values: `JavaObject` for objects, `str` for strings, `JavaArray`,
`None`. Externalizable classes written in block-data mode keep their raw payload as one list
of byte runs and nested objects (`JavaObject.external`), read ONCE for the most-derived class,
which is how `ObjectOutputStream` writes them (the superclass descriptors carry no data).
Every length is checked against the bytes that remain, so a corrupt stream fails fast with
`JavaStreamError` instead of allocating or looping.
"""

from __future__ import annotations

import builtins
import struct
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"\xac\xed\x00\x05"
TC_NULL, TC_REFERENCE, TC_CLASSDESC, TC_OBJECT, TC_STRING, TC_ARRAY, TC_CLASS = range(0x70, 0x77)
TC_BLOCKDATA, TC_ENDBLOCKDATA, TC_RESET, TC_BLOCKDATALONG, TC_EXCEPTION, TC_LONGSTRING = range(0x77, 0x7D)
TC_PROXYCLASSDESC, TC_ENUM = 0x7D, 0x7E
SC_WRITE_METHOD, SC_SERIALIZABLE, SC_EXTERNALIZABLE, SC_BLOCK_DATA, SC_ENUM = 0x01, 0x02, 0x04, 0x08, 0x10
BASE_HANDLE = 0x7E0000
MAX_DEPTH = 64
MAX_HANDLES = 1_000_000
_PRIM = {"B": (">b", 1), "C": (">H", 2), "D": (">d", 8), "F": (">f", 4), "I": (">i", 4), "J": (">q", 8), "S": (">h", 2), "Z": (">?", 1)}


class JavaStreamError(ValueError):
    """The bytes are not a Java serialization stream this reader can follow."""


@dataclass(eq=False)
class ClassDesc:
    name: str
    suid: int
    flags: int
    fields: list[tuple[str, str, str | None]]  # (type code, name, class signature)
    superclass: ClassDesc | None
    proxy_interfaces: list[str] = field(default_factory=list)

    def chain(self) -> list[ClassDesc]:
        """Superclass first, as serializable class data is written."""
        out: list[ClassDesc] = []
        c: ClassDesc | None = self
        while c is not None:
            out.append(c)
            c = c.superclass
        return out[::-1]


def _extend(desc: ClassDesc, superclass: ClassDesc | None) -> None:
    """Sets `desc`'s superclass unless its chain leads back to `desc` (a back-reference to a descriptor
    still being read): ClassDesc.chain() would never end, a 63-byte blob ran the process out of memory."""
    if any(c is desc for c in (superclass.chain() if superclass is not None else ())):
        raise JavaStreamError(f"class descriptor {desc.name} is its own superclass")
    desc.superclass = superclass


@dataclass(eq=False)
class JavaObject:
    classdesc: ClassDesc
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)  # class name -> field -> value
    annotations: dict[str, list[Any]] = field(default_factory=dict)  # class name -> writeObject extras
    external: list[Any] | None = None  # Externalizable payload: bytes runs and nested objects

    @property
    def class_name(self) -> str:
        return self.classdesc.name

    def field(self, name: str) -> Any:
        for values in self.fields.values():
            if name in values:
                return values[name]
        raise KeyError(name)


@dataclass(eq=False)
class JavaArray:
    classdesc: ClassDesc
    items: Any  # bytes for byte[], else a list


@dataclass(eq=False)
class JavaEnum:
    classdesc: ClassDesc | None  # the reader accepts TC_NULL where the enum's descriptor goes
    constant: str


def mutf8(data: bytes) -> str:
    """Java's modified UTF-8: NUL as C0 80, supplementary characters as two 3-byte surrogates."""
    if data.isascii():
        return data.decode("ascii")
    try:
        text = data.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise JavaStreamError(f"invalid modified UTF-8 at byte {e.start}") from None
    # Join surrogate pairs into real characters; a lone surrogate stays as Java had it.
    return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")


def utf16(data: bytes) -> str:
    """`DataOutput.writeChars`: UTF-16BE code units."""
    return data.decode("utf-16-be", "surrogatepass")


_STRUCTS = {fmt: struct.Struct(fmt) for fmt in (">B", ">b", ">H", ">h", ">i", ">q", ">d", ">f", ">?")}


class Reader:
    # The primitives run a few hundred times per OpenJMS blob: they read from `bytes` with
    # precompiled structs and one bounds check each, without an intermediate copy.
    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.end = len(self.data)
        self.pos = 0
        self.handles: list[Any] = []
        self.depth = 0

    # -- primitives ------------------------------------------------------------------------
    def _truncated(self, n: int) -> JavaStreamError:
        return JavaStreamError(f"truncated: needs {n} bytes at offset {self.pos}, {self.end - self.pos} left")

    def take(self, n: int) -> bytes:
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise self._truncated(n)
        self.pos = pos + n
        return self.data[pos:pos + n]

    def unpack(self, fmt: str, n: int) -> Any:
        pos = self.pos
        if pos + n > self.end:
            raise self._truncated(n)
        self.pos = pos + n
        return _STRUCTS[fmt].unpack_from(self.data, pos)[0]

    def u1(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise self._truncated(1)
        self.pos = pos + 1
        return self.data[pos]

    def peek(self) -> int:
        if self.pos >= self.end:
            raise JavaStreamError(f"truncated: stream ends at offset {self.pos}")
        return self.data[self.pos]

    def utf(self) -> str:
        return mutf8(self.take(self.unpack(">H", 2)))

    def new_handle(self, value: Any) -> int:
        if len(self.handles) >= MAX_HANDLES:
            raise JavaStreamError("too many objects in one stream")
        self.handles.append(value)
        return len(self.handles) - 1

    # -- grammar ---------------------------------------------------------------------------
    def stream(self) -> list[Any]:
        """All top-level contents of a stream (usually one object)."""
        if self.take(4) != MAGIC:
            raise JavaStreamError("not a Java serialization stream (magic AC ED 00 05 missing)")
        out = []
        while self.pos < len(self.data):
            out.append(self.content())
        return out

    def content(self) -> Any:
        tc = self.peek()
        if tc == TC_BLOCKDATA:
            self.pos += 1
            return Block(self.take(self.u1()))
        if tc == TC_BLOCKDATALONG:
            self.pos += 1
            return Block(self.take(self.unpack(">i", 4)))
        return self.object()

    def object(self) -> Any:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise JavaStreamError(f"objects nested deeper than {MAX_DEPTH}")
        try:
            return self._object()
        finally:
            self.depth -= 1

    def _object(self) -> Any:
        tc = self.u1()
        if tc == TC_NULL:
            return None
        if tc == TC_REFERENCE:
            handle = self.unpack(">i", 4) - BASE_HANDLE
            if not 0 <= handle < len(self.handles):
                raise JavaStreamError(f"back-reference to unknown handle {handle + BASE_HANDLE:#x}")
            return self.handles[handle]
        if tc == TC_STRING:
            idx = self.new_handle(None)
            self.handles[idx] = s = self.utf()
            return s
        if tc == TC_LONGSTRING:
            idx = self.new_handle(None)
            self.handles[idx] = s = mutf8(self.take(self.unpack(">q", 8)))
            return s
        if tc in (TC_CLASSDESC, TC_PROXYCLASSDESC):
            self.pos -= 1
            return self.classdesc()
        if tc == TC_OBJECT:
            return self.new_object()
        if tc == TC_ARRAY:
            return self.array()
        if tc == TC_ENUM:
            desc = self.classdesc()
            e = JavaEnum(desc, "")
            self.new_handle(e)
            name = self.object()
            if not isinstance(name, str):
                raise JavaStreamError("enum constant name is not a string")
            e.constant = name
            return e
        if tc == TC_CLASS:
            desc = self.classdesc()
            self.new_handle(desc)
            return desc
        if tc == TC_RESET:
            self.handles.clear()
            return self.object()
        if tc == TC_EXCEPTION:
            raise JavaStreamError("the writer failed mid-stream (TC_EXCEPTION)")
        raise JavaStreamError(f"unexpected type code {tc:#04x} at offset {self.pos - 1}")

    def classdesc(self) -> ClassDesc | None:
        tc = self.u1()
        if tc == TC_NULL:
            return None
        if tc == TC_REFERENCE:
            self.pos -= 1
            desc = self._object()
            if not isinstance(desc, ClassDesc):
                raise JavaStreamError("back-reference where a class descriptor was expected")
            return desc
        if tc == TC_PROXYCLASSDESC:
            desc = ClassDesc("<proxy>", 0, SC_SERIALIZABLE, [], None)
            self.new_handle(desc)
            count = self.unpack(">i", 4)
            if count < 0 or count > 65535:
                raise JavaStreamError(f"proxy interface count {count} out of range")
            desc.proxy_interfaces = [self.utf() for _ in range(count)]
            self.annotation()
            _extend(desc, self.classdesc())
            return desc
        if tc != TC_CLASSDESC:
            raise JavaStreamError(f"expected a class descriptor, found type code {tc:#04x}")
        name = self.utf()
        suid = self.unpack(">q", 8)
        desc = ClassDesc(name, suid, 0, [], None)
        self.new_handle(desc)
        desc.flags = self.u1()
        count = self.unpack(">h", 2)
        if count < 0:
            raise JavaStreamError(f"negative field count in {name}")
        for _ in range(count):
            code = chr(self.u1())
            fname = self.utf()
            sig = None
            if code in "[L":
                sig = self.object()
                if not isinstance(sig, str):
                    raise JavaStreamError(f"field {name}.{fname} has no type signature")
            elif code not in _PRIM:
                raise JavaStreamError(f"field {name}.{fname} has unknown type code {code!r}")
            desc.fields.append((code, fname, sig))
        self.annotation()
        _extend(desc, self.classdesc())
        return desc

    def annotation(self) -> list[Any]:
        """Block data and objects up to TC_ENDBLOCKDATA."""
        items: list[Any] = []
        while self.peek() != TC_ENDBLOCKDATA:
            items.append(self.content())
        self.pos += 1
        return items

    def new_object(self) -> JavaObject:
        desc = self.classdesc()
        if desc is None:
            raise JavaStreamError("object without a class descriptor")
        obj = JavaObject(desc)
        self.new_handle(obj)
        if desc.flags & SC_EXTERNALIZABLE:
            if not desc.flags & SC_BLOCK_DATA:
                raise JavaStreamError(f"{desc.name}: externalizable data in protocol version 1 is not supported")
            obj.external = merge_blocks(self.annotation())
            return obj
        for cls in desc.chain():
            if cls.flags & SC_SERIALIZABLE:
                obj.fields[cls.name] = {fname: self.value(code) for code, fname, _ in cls.fields}
                if cls.flags & SC_WRITE_METHOD:
                    obj.annotations[cls.name] = self.annotation()
        return obj

    def value(self, code: str) -> Any:
        if code in _PRIM:
            fmt, n = _PRIM[code]
            return self.unpack(fmt, n)
        return self.object()

    def array(self) -> JavaArray:
        desc = self.classdesc()
        if desc is None or not desc.name.startswith("["):
            raise JavaStreamError("array without an array class descriptor")
        arr = JavaArray(desc, None)
        self.new_handle(arr)
        size = self.unpack(">i", 4)
        code = desc.name[1]
        width = _PRIM[code][1] if code in _PRIM else 1
        if size < 0 or size * width > len(self.data) - self.pos:
            raise JavaStreamError(f"array of {size} elements does not fit in the {len(self.data) - self.pos} bytes left")
        if code == "B":
            arr.items = self.take(size)
        else:
            arr.items = [self.value(code) for _ in range(size)]
        return arr


class Block(bytes):
    """A run of block data (primitive values written by writeExternal / writeObject)."""


def merge_blocks(items: list[Any]) -> list[Any]:
    """Consecutive block-data segments are one primitive stream, cut at arbitrary bytes."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, Block) and out and isinstance(out[-1], Block):
            out[-1] = Block(out[-1] + item)
        else:
            out.append(item)
    return out


def read(data: bytes) -> Any:
    """The single top-level object of a stream."""
    contents = Reader(data).stream()
    if len(contents) != 1:
        raise JavaStreamError(f"expected one top-level object, found {len(contents)}")
    return contents[0]


class Payload:
    """Reads an externalizable payload the way its readExternal would."""

    def __init__(self, owner: JavaObject) -> None:
        if owner.external is None:
            raise JavaStreamError(f"{owner.class_name} is not externalizable")
        self.owner = owner.class_name
        self.items = owner.external
        self.index = 0
        self.pos = 0

    def _bytes(self, n: int) -> bytes:
        item = self.items[self.index] if self.index < len(self.items) else None
        if not isinstance(item, Block) or self.pos + n > len(item):
            raise JavaStreamError(f"{self.owner}: payload ends early (needs {n} more bytes)")
        out = item[self.pos:self.pos + n]
        self.pos += n
        if self.pos == len(item):
            self.index, self.pos = self.index + 1, 0
        return bytes(out)

    def long(self) -> int:
        return struct.unpack(">q", self._bytes(8))[0]

    def int(self) -> int:
        return struct.unpack(">i", self._bytes(4))[0]

    def bool(self) -> bool:
        return self._bytes(1) != b"\x00"

    # The methods int, bool and bytes shadow the builtins in this class's scope, hence builtins.*.
    def bytes(self, n: builtins.int) -> builtins.bytes:
        if n < 0:
            raise JavaStreamError(f"{self.owner}: negative length {n}")
        return self._bytes(n) if n else b""

    def chars(self, n: builtins.int) -> str:
        return utf16(self.bytes(2 * n))

    def utf(self) -> str:
        return mutf8(self.bytes(struct.unpack(">H", self._bytes(2))[0]))

    def object(self) -> Any:
        if self.pos != 0 or self.index >= len(self.items) or isinstance(self.items[self.index], Block):
            raise JavaStreamError(f"{self.owner}: expected an object in the payload")
        item = self.items[self.index]
        self.index += 1
        return item

    def done(self) -> builtins.bool:
        return self.index >= len(self.items)
