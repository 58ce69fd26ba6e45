# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""OpenJMS `messages.messageBlob` read along OpenJMS's writeExternal layouts, compiled by the
machine's C compiler at install (issue 49): openjms_fast's reader, step for step, in C types.

openjms_fast, pure Python, spends 30-50 µs a blob in some 360 interpreted calls (the walk of
~30 objects and ~18 class descriptors); the same walk with typed positions and C-level calls
takes a few µs, the rest being the dicts the caller gets. It keeps openjms_fast's contract: it
answers only where the generic reader gives the same answer, and returns None for anything
else (the caller then asks the generic reader, which words any error). tests/codecs hold it to
openjms_fast and to the generic reader with hypothesis and every golden vector.

Class descriptors are remembered in javaser_walk's cache, shared with openjms_fast (the same
entries: a chain's handle holds (None, chain, kind) in both).
"""

from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF16
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memcmp

import binascii
import struct

from bridge.codecs.javaser import MAX_HANDLES, mutf8
from bridge.codecs.javaser_walk import (
    BOXED,
    BYTES,
    CACHE_LIMIT,
    CHARACTER,
    DESCS,
    MAP,
    PENDING,
    READ_MAP,
    Decline,
    Known,
    kind_of,
    parse_desc,
)

cdef enum:
    TC_NULL = 0x70
    TC_REFERENCE = 0x71
    TC_CLASSDESC = 0x72
    TC_OBJECT = 0x73
    TC_STRING = 0x74
    TC_ARRAY = 0x75
    TC_BLOCKDATA = 0x77
    TC_ENDBLOCKDATA = 0x78
    TC_BLOCKDATALONG = 0x7A
    TC_LONGSTRING = 0x7C
    EXTERNAL_FLAGS = 0x0C  # SC_EXTERNALIZABLE | SC_BLOCK_DATA
    BASE_HANDLE = 0x7E0000
    DESTINATION_SIZE = 29
    MAX_DEPTH = 64  # stricter than openjms_fast (Python's limit lets it go ~300 deep): a decline, never another answer

cdef extern from "Python.h":
    object PyUnicode_FromKindAndData(int kind, const void* buffer, Py_ssize_t size)
    int PyUnicode_4BYTE_KIND
    double PyFloat_Unpack4(const char* p, int le) except? -1.0
    double PyFloat_Unpack8(const char* p, int le) except? -1.0

# java.lang's boxes by size: Boolean, Byte, Short, Character, Integer, Float, Long, Double
cdef dict _BOX_CODES = {
    "java.lang.Boolean": 1, "java.lang.Byte": 2, "java.lang.Short": 3, CHARACTER: 4, "java.lang.Integer": 5,
    "java.lang.Float": 6, "java.lang.Long": 7, "java.lang.Double": 8,
}
cdef bytes _MAGIC = b"\xac\xed\x00\x05"
MESSAGE = "org.exolab.jms.message."
CLIENT = "org.exolab.jms.client."
# What a handle holds is (tag, value); these tags are compared by identity, as in openjms_fast.
_HEADER, _PROPERTIES, _DEST = "header", "properties", "destination"
_TIMESTAMP, _PRIORITY, _DELIVERY_MODE = MESSAGE + "Timestamp", MESSAGE + "Priority", MESSAGE + "DeliveryModeImpl"
_TYPE, _MESSAGE_ID, _CORRELATION = MESSAGE + "Type", MESSAGE + "MessageId", MESSAGE + "CorrelationId"
_QUEUE, _TOPIC = CLIENT + "JmsQueue", CLIENT + "JmsTopic"
_TEMPORARY_QUEUE, _TEMPORARY_TOPIC = CLIENT + "JmsTemporaryQueue", CLIENT + "JmsTemporaryTopic"

cdef enum External:
    X_HEADER = 1
    X_PROPERTIES
    X_TIMESTAMP
    X_PRIORITY
    X_DELIVERY_MODE
    X_TYPE
    X_MESSAGE_ID
    X_CORRELATION
    X_QUEUE
    X_TOPIC
    X_TEMPORARY_QUEUE
    X_TEMPORARY_TOPIC

cdef dict _EXTERNAL = {
    MESSAGE + "MessageHeader": X_HEADER, MESSAGE + "MessageProperties": X_PROPERTIES,
    _TIMESTAMP: X_TIMESTAMP, _PRIORITY: X_PRIORITY, _DELIVERY_MODE: X_DELIVERY_MODE,
    _TYPE: X_TYPE, _MESSAGE_ID: X_MESSAGE_ID, _CORRELATION: X_CORRELATION,
    _QUEUE: X_QUEUE, _TOPIC: X_TOPIC, _TEMPORARY_QUEUE: X_TEMPORARY_QUEUE, _TEMPORARY_TOPIC: X_TEMPORARY_TOPIC,
}

cdef enum Body:
    B_EMPTY = 1
    B_TEXT
    B_MAP
    B_BASE64
    B_STREAM

cdef dict _BODIES = {
    MESSAGE + "MessageImpl": B_EMPTY, MESSAGE + "TextMessageImpl": B_TEXT, MESSAGE + "MapMessageImpl": B_MAP,
    MESSAGE + "BytesMessageImpl": B_BASE64, MESSAGE + "ObjectMessageImpl": B_BASE64,
    MESSAGE + "StreamMessageImpl": B_STREAM,
}


cdef class _Chain:
    """A descriptor chain seen whole (every superclass new in its stream): the bytes after its
    key, the entry its handle holds and the handles the chain takes."""
    cdef bytes rest
    cdef object entry
    cdef list handles

    def __cinit__(self, bytes rest, object entry, list handles):
        self.rest, self.entry, self.handles = rest, entry, handles


# key (the descriptor's name, suid, flags and field count) -> _Chain; javaser_walk.DESCS keeps
# the same knowledge for the slow path, in Python objects.
cdef dict _CHAINS = {}


cdef inline int64_t _q(const unsigned char* p) noexcept:
    return <int64_t>((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) | (<uint64_t>p[3] << 32)
                     | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) | (<uint64_t>p[6] << 8) | <uint64_t>p[7])


cdef inline int32_t _i(const unsigned char* p) noexcept:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline Py_ssize_t _H(const unsigned char* p) noexcept:
    return (p[0] << 8) | p[1]


cdef inline bint _ascii(const unsigned char* p, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] & 0x80:
            return False
    return True


cdef str _mutf8(bytes buf, Py_ssize_t start, Py_ssize_t end):
    """javaser.mutf8 of buf[start:end]: ASCII and Java's own 2- and 3-byte forms (NUL as C0 80,
    surrogates one by one, a high and a low one joined) decoded here; anything else (a 4-byte
    form, a byte Python's UTF-8 decoder refuses) is left to javaser.mutf8, which words the error."""
    cdef const unsigned char* p = <const unsigned char*>(<char*>buf) + start
    cdef Py_ssize_t n = end - start, i = 0, k = 0
    if _ascii(p, n):
        return PyUnicode_DecodeASCII(<const char*>p, n, NULL)
    cdef uint32_t* out = <uint32_t*>PyMem_Malloc(n * sizeof(uint32_t))
    if out == NULL:
        raise MemoryError
    cdef unsigned int c, c1, c2
    try:
        while i < n:
            c = p[i]
            if c < 0x80:
                i += 1
            elif c == 0xC0 and i + 1 < n and p[i + 1] == 0x80:
                c = 0
                i += 2
            elif 0xC2 <= c <= 0xDF and i + 1 < n and p[i + 1] & 0xC0 == 0x80:
                c = ((c & 0x1F) << 6) | (p[i + 1] & 0x3F)
                i += 2
            elif 0xE0 <= c <= 0xEF and i + 2 < n and p[i + 1] & 0xC0 == 0x80 and p[i + 2] & 0xC0 == 0x80:
                c1, c2 = p[i + 1], p[i + 2]
                if c == 0xE0 and c1 < 0xA0:  # overlong: the UTF-8 decoder refuses it
                    return mutf8(buf[start:end])
                c = ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (c2 & 0x3F)
                i += 3
            else:
                return mutf8(buf[start:end])
            if 0xDC00 <= c <= 0xDFFF and k > 0 and 0xD800 <= out[k - 1] <= 0xDBFF:
                out[k - 1] = 0x10000 + ((out[k - 1] - 0xD800) << 10) + (c - 0xDC00)
            else:
                out[k] = c
                k += 1
        return PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, k)
    finally:
        PyMem_Free(out)


cdef inline str _utf16(bytes buf, Py_ssize_t start, Py_ssize_t end):
    cdef int order = 1  # big-endian
    return PyUnicode_DecodeUTF16(<char*>buf + start, end - start, "surrogatepass", &order)


cdef inline str _b64(bytes raw):
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


cdef dict _typed(object value):
    """A property or map value in the manifests' convention (openjms_blob.typed)."""
    if value is None:
        return {"type": None, "value": None}
    if type(value) is str:
        return {"type": "java.lang.String", "value": value}
    if type(value) is tuple:
        if value[0] is BOXED:
            return {"type": value[1][0], "value": value[1][1]}
        if value[0] is BYTES:
            return {"type": "byte[]", "base64": _b64(value[1])}
    raise Decline


cdef dict _typed_map(object entries):
    return {} if entries is None else {k: _typed(v) for k, v in entries.items()}


cdef class _Reader:
    cdef bytes data
    cdef const unsigned char* p
    cdef Py_ssize_t pos, end
    cdef list handles
    cdef int depth  # objects being read inside one another (a message nests 3 deep)
    # the last segment read: its buffer (the stream, or its joined blocks) and bounds
    cdef bytes seg
    cdef Py_ssize_t s0, s1

    def __cinit__(self, bytes data):
        self.data = data
        self.p = <const unsigned char*>(<char*>data)
        self.end = len(data)
        self.pos = 0
        self.handles = []
        self.depth = 0

    cdef inline int byte(self, Py_ssize_t i) except -1:
        if i < 0 or i >= self.end:
            raise Decline
        return self.p[i]

    cdef inline bint starts(self, bytes prefix, Py_ssize_t at):
        cdef Py_ssize_t n = len(prefix)
        return at + n <= self.end and memcmp(self.p + at, <char*>prefix, n) == 0

    # -- block data ------------------------------------------------------------------------
    cdef Py_ssize_t block(self, Py_ssize_t pos, Py_ssize_t* start) except -1:
        """The block-data segment whose header is at pos: its end, its start into `start`."""
        cdef Py_ssize_t end, n
        cdef int tc = self.byte(pos)
        if tc == TC_BLOCKDATA:
            start[0] = pos + 2
            end = start[0] + self.byte(pos + 1)
        elif tc == TC_BLOCKDATALONG:
            start[0] = pos + 5
            if start[0] > self.end:
                raise Decline
            n = _i(self.p + pos + 1)
            if n < 0:
                raise Decline
            end = start[0] + n
        else:
            raise Decline
        if end >= self.end:  # a payload always ends with its end marker
            raise Decline
        return end

    cdef int segment(self) except -1:
        """The primitive data up to the next object, consecutive segments joined, into seg/s0/s1."""
        cdef Py_ssize_t start
        cdef Py_ssize_t end = self.block(self.pos, &start)
        cdef int tc = self.p[end]
        if tc == TC_BLOCKDATA or tc == TC_BLOCKDATALONG:
            return self.joined(start, end)
        self.pos = end
        self.seg, self.s0, self.s1 = self.data, start, end
        return 0

    cdef int joined(self, Py_ssize_t start, Py_ssize_t end) except -1:
        cdef list parts = [self.data[start:end]]
        cdef Py_ssize_t pos = end
        cdef int tc = self.p[pos]
        while tc == TC_BLOCKDATA or tc == TC_BLOCKDATALONG:
            end = self.block(pos, &start)
            parts.append(self.data[start:end])
            pos = end
            tc = self.p[pos]
        self.pos = pos
        joined = b"".join(parts)
        self.seg, self.s0, self.s1 = joined, 0, len(joined)
        return 0

    cdef Py_ssize_t fixed(self, Py_ssize_t size) except -1:
        """A segment of exactly `size` bytes: its start in seg."""
        cdef Py_ssize_t pos = self.pos, end = pos + 2 + size
        cdef int tc
        if end < self.end and self.byte(pos) == TC_BLOCKDATA and self.p[pos + 1] == size:
            tc = self.p[end]
            if tc != TC_BLOCKDATA and tc != TC_BLOCKDATALONG:
                self.pos = end
                self.seg = self.data
                return pos + 2
        self.segment()
        if self.s1 - self.s0 != size:
            raise Decline
        return self.s0

    # -- class descriptors -----------------------------------------------------------------
    cdef object classdesc(self, int depth):
        """The descriptor chain at pos as its handle holds it; None for TC_NULL."""
        cdef Py_ssize_t pos = self.pos, key_end, index
        cdef int tc = self.byte(pos)
        if tc == TC_NULL:
            self.pos = pos + 1
            return None
        if tc == TC_REFERENCE:
            self.pos = pos + 5
            return self.desc_at(pos)
        if tc != TC_CLASSDESC or depth > 8 or pos + 3 > self.end:
            raise Decline
        key_end = pos + 14 + _H(self.p + pos + 1)  # name length, name, suid, flags, field count
        if key_end > self.end:
            raise Decline
        data = self.data
        key = data[pos + 1:key_end]
        cdef _Chain chain_seen = _CHAINS.get(key)
        if chain_seen is not None and self.starts(chain_seen.rest, key_end):
            self.pos = key_end + len(chain_seen.rest)
            self.handles.extend(chain_seen.handles)
            return chain_seen.entry
        known = DESCS.get(key)
        whole = known.whole if known is not None else None
        if whole is not None and self.starts(whole[0], key_end):
            if len(_CHAINS) < CACHE_LIMIT:
                _CHAINS[key] = _Chain(whole[0], whole[1], whole[2])
            self.pos = key_end + len(whole[0])
            self.handles.extend(whole[2])
            return whole[1]
        if known is not None and self.starts(known.tail, key_end):
            desc, tail = known.desc, known.tail
        else:
            desc, tail = parse_desc(data, pos + 1, key_end)
            if known is None and len(DESCS) < CACHE_LIMIT:
                known = Known(desc, tail)
                DESCS[key] = known
            else:
                known = None  # the same name and suid with other fields: read, not remembered
        pos = self.pos = key_end + len(tail)
        handles = self.handles
        index = len(handles)
        handles.append(PENDING)
        if known is not None and self.byte(pos) == TC_REFERENCE:
            # A superclass read before (Number under a second box class): the chain is known by it.
            referenced = self.desc_at(pos)
            for held, entry in known.under:
                if held is referenced:
                    self.pos = pos + 5
                    handles[index] = entry
                    return entry
        superclass = self.classdesc(depth + 1)
        chain = (desc,) if superclass is None else (desc,) + superclass[1]
        entry = (None, chain, kind_of(chain))
        handles[index] = entry
        if known is not None and known.whole is None and len(handles) - index == len(chain):
            known.whole = data[key_end:self.pos], entry, handles[index:]
        elif known is not None and superclass is not None and len(known.under) < 8:
            known.under.append((superclass, entry))
        return entry

    cdef object desc_at(self, Py_ssize_t pos):
        if pos + 5 > self.end:
            raise Decline
        cdef Py_ssize_t handle = <Py_ssize_t>_i(self.p + pos + 1) - BASE_HANDLE
        if handle < 0 or handle >= len(self.handles):
            raise Decline
        entry = self.handles[handle]
        if type(entry) is not tuple or entry[0] is not None:
            raise Decline
        return entry

    # -- objects ---------------------------------------------------------------------------
    cdef object obj(self):
        """The object at pos: None, a str, or (tag, value) for what this reader knows."""
        cdef Py_ssize_t pos = self.pos, start, end, handle, index
        cdef int64_t n
        cdef int tc = self.byte(pos)
        if tc == TC_OBJECT:
            # C calls know no recursion limit: a blob nesting objects tens of thousands deep would
            # overflow the C stack where openjms_fast meets Python's limit and declines.
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Decline
            if self.byte(pos + 1) == TC_REFERENCE:  # the usual case after a class's first object
                self.pos = pos + 6
                kind = self.desc_at(pos + 1)[2]
            else:
                self.pos = pos + 1
                entry = self.classdesc(0)
                if entry is None:
                    raise Decline
                kind = entry[2]
            handles = self.handles
            index = len(handles)
            handles.append(PENDING)
            if type(kind) is tuple:  # a boxed primitive
                java_class = kind[0]
                held = (BOXED, (java_class, self.boxed(_BOX_CODES[java_class], java_class)))
            elif kind is READ_MAP:
                held = (MAP, self.hashmap())
            else:  # an externalizable class: its writeExternal payload, then the end of its block data
                code = _EXTERNAL.get(kind) if kind is not None else None
                if code is None:
                    raise Decline
                held = self.external(code)
                if self.byte(self.pos) != TC_ENDBLOCKDATA:
                    raise Decline
                self.pos += 1
            handles[index] = held
            self.depth -= 1
            return held
        if tc == TC_NULL:
            self.pos = pos + 1
            return None
        if tc == TC_REFERENCE:
            if pos + 5 > self.end:
                raise Decline
            handle = <Py_ssize_t>_i(self.p + pos + 1) - BASE_HANDLE
            if handle < 0 or handle >= len(self.handles):
                raise Decline
            self.pos = pos + 5
            return self.handles[handle]
        if tc == TC_STRING:
            if pos + 3 > self.end:
                raise Decline
            start = pos + 3
            end = start + _H(self.p + pos + 1)
        elif tc == TC_LONGSTRING:
            if pos + 9 > self.end:
                raise Decline
            start = pos + 9
            n = _q(self.p + pos + 1)
            if n < 0 or n > self.end - start:
                raise Decline
            end = start + <Py_ssize_t>n
        elif tc == TC_ARRAY:
            self.pos = pos + 1
            return self.array()
        else:
            raise Decline
        if end > self.end:
            raise Decline
        self.pos = end
        text = _mutf8(self.data, start, end)
        self.handles.append(text)
        return text

    cdef object boxed(self, int code, str java_class):
        """The `value` of a java.lang box (javaser_walk.kind_of's shapes), as struct would read it."""
        cdef Py_ssize_t pos = self.pos
        cdef Py_ssize_t size = 1 if code <= 2 else 2 if code <= 4 else 4 if code <= 6 else 8
        if pos + size > self.end:
            raise Decline
        cdef const unsigned char* b = self.p + pos
        self.pos = pos + size
        if code == 1:
            return b[0] != 0
        if code == 2:
            return <signed char>b[0]
        if code == 3:
            return <short>_H(b)
        if code == 4:
            return chr(_H(b))
        if code == 5:
            return _i(b)
        if code == 6:
            return PyFloat_Unpack4(<const char*>b, 0)
        if code == 7:
            return _q(b)
        return PyFloat_Unpack8(<const char*>b, 0)

    cdef dict hashmap(self):
        """java.util.HashMap's writeObject: its two fields, a block (capacity, size), then pairs."""
        cdef Py_ssize_t pos = self.pos + 8  # loadFactor, threshold: not needed to read it back
        cdef int32_t size
        if self.byte(pos) != TC_BLOCKDATA or self.byte(pos + 1) != 8 or pos + 10 > self.end:
            raise Decline
        size = _i(self.p + pos + 6)
        if size < 0:
            raise Decline
        self.pos = pos + 10
        cdef dict entries = {}
        for _ in range(size):
            key = self.obj()
            if type(key) is not str:
                raise Decline
            entries[key] = self.obj()
        if self.byte(self.pos) != TC_ENDBLOCKDATA:
            raise Decline
        self.pos += 1
        return entries

    cdef tuple array(self):
        entry = self.classdesc(0)
        if entry is None or entry[1][0].name != "[B":
            raise Decline
        self.handles.append(PENDING)
        cdef Py_ssize_t pos = self.pos, end
        if pos + 4 > self.end:
            raise Decline
        cdef int32_t size = _i(self.p + pos)
        if size < 0:
            raise Decline
        end = pos + 4 + size
        if end > self.end:
            raise Decline
        self.pos = end
        held = (BYTES, self.data[pos + 4:end])
        self.handles[len(self.handles) - 1] = held
        return held

    cdef object text_or_null(self):
        value = self.obj()
        if value is not None and type(value) is not str:
            raise Decline
        return value

    cdef object tagged(self, object tag):
        """The value of an object of kind `tag`, or None for null."""
        value = self.obj()
        if value is None:
            return None
        if type(value) is not tuple or value[0] is not tag:
            raise Decline
        return value[1]

    # -- the OpenJMS classes ---------------------------------------------------------------
    cdef tuple message(self):
        if not self.starts(_MAGIC, 0) or self.byte(4) != TC_OBJECT:
            raise Decline
        self.pos = 5
        entry = self.classdesc(0)
        if entry is None:
            raise Decline
        top = entry[1][0]
        if top.flags & EXTERNAL_FLAGS != EXTERNAL_FLAGS:
            raise Decline
        java_class = top.name
        body_code = _BODIES.get(java_class)
        if body_code is None:
            raise Decline
        self.handles.append(PENDING)
        cdef Py_ssize_t at = self.fixed(26)
        cdef const unsigned char* b = <const unsigned char*>(<char*>self.seg) + at
        read_only, processed, accepted, sequence = b[8] != 0, b[9] != 0, _q(b + 10), _q(b + 18)
        header = self.tagged(_HEADER)
        if header is None:
            raise Decline
        headers, more = header
        properties = self.tagged(_PROPERTIES) or {}
        body = self.body(body_code)
        if self.byte(self.pos) != TC_ENDBLOCKDATA or self.pos + 1 != self.end or len(self.handles) > MAX_HANDLES:
            raise Decline
        internal = {"readOnly": read_only, "processed": processed, "acceptedTime": accepted, "sequenceNumber": sequence}
        internal.update(more)
        return java_class, headers, properties, body, internal

    cdef dict body(self, int code):
        if code == B_EMPTY:
            return {}
        if code == B_TEXT:
            self.fixed(8)
            return {"text": self.text_or_null()}
        if code == B_MAP:
            self.fixed(8)
            return {"map": _typed_map(self.tagged(MAP))}
        if code == B_BASE64:
            return {"base64": _b64(self.raw())}
        return {"stream": self.raw()}

    cdef bytes raw(self):
        self.segment()
        cdef bytes buf = self.seg
        cdef Py_ssize_t start = self.s0, end = self.s1
        if end - start < 12 or start + 12 + _i(<const unsigned char*>(<char*>buf) + start + 8) != end:
            raise Decline
        return buf[start + 12:end]

    cdef object external(self, int code):
        cdef Py_ssize_t at
        if code == X_HEADER:
            return self.header()
        if code == X_PROPERTIES:
            self.fixed(8)
            return _PROPERTIES, _typed_map(self.tagged(MAP))
        if code == X_TIMESTAMP:
            at = self.fixed(16)
            return _TIMESTAMP, _q(<const unsigned char*>(<char*>self.seg) + at + 8)
        if code == X_PRIORITY:
            at = self.fixed(12)
            return _PRIORITY, _i(<const unsigned char*>(<char*>self.seg) + at + 8)
        if code == X_DELIVERY_MODE:
            at = self.fixed(12)
            return _DELIVERY_MODE, _i(<const unsigned char*>(<char*>self.seg) + at + 8)
        if code == X_TYPE:
            self.segment()
            if self.s1 - self.s0 < 12:
                raise Decline
            return _TYPE, self.chars_at(self.seg, self.s0 + 8, self.s1)
        if code == X_MESSAGE_ID:
            self.segment()
            return _MESSAGE_ID, self.message_id_at(self.seg, self.s0, self.s1)
        if code == X_CORRELATION:
            return self.correlation()
        if code == X_QUEUE:
            return self.destination(_QUEUE, "queue", False)
        if code == X_TOPIC:
            return self.destination(_TOPIC, "topic", False)
        if code == X_TEMPORARY_QUEUE:
            return self.destination(_TEMPORARY_QUEUE, "queue", True)
        return self.destination(_TEMPORARY_TOPIC, "topic", True)

    cdef tuple header(self):
        self.fixed(8)
        reply_to = self.copied_destination()
        timestamp = self.tagged(_TIMESTAMP)
        correlation = self.tagged(_CORRELATION)
        cdef Py_ssize_t at = self.fixed(9)
        cdef const unsigned char* b = <const unsigned char*>(<char*>self.seg) + at
        redelivered, expiration = b[0] != 0, _q(b + 1)
        priority = self.tagged(_PRIORITY)
        jms_type = self.tagged(_TYPE)
        destination = self.copied_destination()
        mode = self.tagged(_DELIVERY_MODE)
        message_id = self.tagged(_MESSAGE_ID)
        wildcard = self.text_or_null()
        unused = self.text_or_null()
        at = self.fixed(8)
        headers = {
            "JMSMessageID": message_id, "JMSCorrelationID": correlation, "JMSReplyTo": reply_to,
            "JMSDestination": destination, "JMSType": jms_type, "JMSDeliveryMode": mode, "JMSPriority": priority,
            "JMSTimestamp": timestamp, "JMSExpiration": expiration, "JMSRedelivered": redelivered,
        }
        consumer = _q(<const unsigned char*>(<char*>self.seg) + at)
        return _HEADER, (headers, {"wildcard": wildcard, "consumerId": consumer, "consumerIdString": unused})

    cdef object copied_destination(self):
        cdef dict held = self.tagged(_DEST)
        return None if held is None else held.copy()  # a shared destination still gives each header its own dict

    cdef str message_id_at(self, bytes buf, Py_ssize_t at, Py_ssize_t end):
        """A MessageId payload from `at`: version 1 (pre-0.7.6) holds a String object after the
        block, later versions a writeUTF."""
        cdef const unsigned char* b = <const unsigned char*>(<char*>buf)
        if end - at < 8:
            raise Decline
        if _q(b + at) == 1:
            value = self.text_or_null() if end - at == 8 else None
            if value is None:
                raise Decline
            return value if value.startswith("ID:") else "ID:" + value
        if end - at < 10 or at + 10 + _H(b + at + 8) != end:
            raise Decline
        return _mutf8(buf, at + 10, end)

    cdef str chars_at(self, bytes buf, Py_ssize_t at, Py_ssize_t end):
        """`int n` then n UTF-16 code units, filling the segment to `end`."""
        cdef int64_t n = _i(<const unsigned char*>(<char*>buf) + at)
        if n < 0 or at + 4 + 2 * n != end:
            raise Decline
        return _utf16(buf, at + 4, end)

    cdef tuple correlation(self):
        self.segment()
        cdef bytes buf = self.seg
        cdef Py_ssize_t start = self.s0, end = self.s1
        if end - start < 16:
            raise Decline
        cdef int32_t usage = _i(<const unsigned char*>(<char*>buf) + start + 8)
        if usage == 1:  # APPLICATION_USE: the application's own string
            return _CORRELATION, self.chars_at(buf, start + 12, end)
        if usage == 2:  # PROVIDER_USE: a message id, embedded without an object header
            return _CORRELATION, self.message_id_at(buf, start + 12, end)
        raise Decline

    cdef tuple destination(self, str java_class, str kind, bint temporary):
        self.segment()
        cdef bytes buf = self.seg
        cdef Py_ssize_t at = self.s0, end = self.s1
        connection = None
        if temporary:
            if end - at < 8:
                raise Decline
            if _q(<const unsigned char*>(<char*>buf) + at) >= 2:  # 0.7.7: a long connection id
                if end - at < 16:
                    raise Decline
                connection = _q(<const unsigned char*>(<char*>buf) + at + 8)
                at += 16
            else:  # 0.7.6.1: a String, between two blocks
                if end - at != 8:
                    raise Decline
                connection = self.text_or_null()
                self.segment()
                buf, at, end = self.seg, self.s0, self.s1
        if end - at < DESTINATION_SIZE:
            raise Decline
        persistent = (<const unsigned char*>(<char*>buf))[at + 16] != 0
        out = {"java_class": java_class, "name": self.chars_at(buf, at + 25, end), "kind": kind,
               "temporary": temporary, "persistent": persistent}
        if temporary:
            out["connectionId"] = connection
        return _DEST, out


def read(blob):
    """(java_class, headers, properties, body, internal) of a blob in OpenJMS's own layout, as
    openjms_fast.read gives them; None for anything else."""
    try:
        return _Reader(blob if type(blob) is bytes else bytes(blob)).message()
    except (Decline, IndexError, struct.error, ValueError, RecursionError):
        return None


def modified_utf8(data):
    """javaser.mutf8, as this reader decodes it (for the tests that hold the two equal)."""
    cdef bytes raw = bytes(data)
    return _mutf8(raw, 0, len(raw))
