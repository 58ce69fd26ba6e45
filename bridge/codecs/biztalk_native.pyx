# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""BizTalk `Spool.imgContext` bags read in C types, compiled by the machine's C compiler at install
(issue 49): biztalk.decode_context, step for step, for a bag that follows the layout.

The Python reader spends most of a bag in its cursor's calls (five a property) and in making each
property; this one reads the same bytes with typed positions and makes each property as a tuple.
It answers only a bag the Python reader reads without error, with the very same answer; for
anything else it returns None and the caller asks the Python reader, which words the error.
tests/codecs hold the two equal on every golden vector, on hypothesis-made bags and on mutations.
"""

from cpython.object cimport PyObject, PyTypeObject
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF16
from libc.math cimport fabs, isnan, nearbyint
from libc.stdio cimport snprintf
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

from bridge.codecs.biztalk_values import (CLSID_C4, CLSID_D4, ERROR_NS, MAX_BLOCK, MAX_ITEMS, SYSTEM_NS, VT_ARRAY,
                                          ContextProperty, currency, ole_date)

cdef extern from "Python.h":
    double PyFloat_Unpack4(const char* p, int le) except? -1.0
    double PyFloat_Unpack8(const char* p, int le) except? -1.0
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    int PyUnicode_KIND(object text)
    int PyUnicode_1BYTE_KIND
    void* PyUnicode_DATA(object text)

cdef extern from "zlib.h":
    ctypedef struct z_stream:
        unsigned char* next_in  # z_const: const only where ZLIB_CONST is defined
        unsigned int avail_in
        unsigned char* next_out
        unsigned int avail_out
    int inflateInit(z_stream* strm)
    int inflate(z_stream* strm, int flush)
    int inflateReset(z_stream* strm)
    int inflateEnd(z_stream* strm)
    int Z_OK, Z_STREAM_END, Z_FINISH

# as C values: a module global read in the loop is a dict lookup and a Python int each time
cdef Py_ssize_t _MAX_ITEMS = MAX_ITEMS
cdef int _VT_ARRAY = VT_ARRAY
cdef int32_t _MAX_BLOCK = MAX_BLOCK
# A fragment whose blocks claim more is left to the Python reader, which builds the part block by
# block and stops at the first block that does not inflate to its size: the headers alone could
# claim a megabyte a 13-byte block, and this reader allocates the whole part before inflating.
cdef Py_ssize_t _MAX_PART = 16 << 20


class _Decline(Exception):
    """Not a bag this reader answers: the Python reader decides (and words why)."""


cdef type _PROPERTY = ContextProperty
# tuple's own constructor, called as tuple.__new__(ContextProperty, fields) is, without the call
# through Python (the NamedTuple's generated __new__ costs as much as the rest of a property)
cdef PyTypeObject* _TUPLE = <PyTypeObject*>tuple


cdef inline int32_t _i32(const unsigned char* p) noexcept:
    return <int32_t>(<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24))


cdef inline uint16_t _u16(const unsigned char* p) noexcept:
    return <uint16_t>(p[0] | (p[1] << 8))


cdef inline uint64_t _u64(const unsigned char* p) noexcept:
    return <uint64_t>_i32(p) & 0xFFFFFFFF | (<uint64_t><uint32_t>_i32(p + 4) << 32)


cdef int64_t _DAY_MS = 86_400_000
cdef int64_t _OLE_EPOCH_DAY = -25569  # 1899-12-30, in days from 1970-01-01


cdef str _ole_date(double value):
    """biztalk_values.ole_date, in C for the years it prints with four digits (Python's strftime
    pads no year below 1000, and the datetime it goes through refuses some: those go to it)."""
    if isnan(value) or fabs(value) > 2_958_466:
        raise _Decline
    cdef int64_t days = <int64_t>value  # toward zero, as int() does
    cdef int64_t ms = <int64_t>nearbyint(fabs(value - <double>days) * 86_400_000.0)  # half to even, as round() does
    cdef int64_t total = (days + _OLE_EPOCH_DAY) * _DAY_MS + ms
    cdef int64_t z = total // _DAY_MS, rest
    if total % _DAY_MS < 0:
        z -= 1
    rest = total - z * _DAY_MS
    # civil_from_days (H. Hinnant): the proleptic Gregorian date of day z from 1970-01-01
    z += 719468
    cdef int64_t era = (z if z >= 0 else z - 146096) // 146097
    cdef int64_t doe = z - era * 146097
    cdef int64_t yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef int64_t doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef int64_t mp = (5 * doy + 2) // 153
    cdef int64_t day = doy - (153 * mp + 2) // 5 + 1
    cdef int64_t month = mp + 3 if mp < 10 else mp - 9
    cdef int64_t year = yoe + era * 400 + (1 if month <= 2 else 0)
    if year < 1000 or year > 9999:
        return ole_date(value)
    cdef char text[32]
    cdef int n = snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03d", <int>year, <int>month, <int>day,
                          <int>(rest // 3_600_000), <int>(rest // 60_000 % 60), <int>(rest // 1000 % 60), <int>(rest % 1000))
    return PyUnicode_DecodeASCII(text, n, NULL)


cdef str _utf16(const unsigned char* s, Py_ssize_t size):
    """UTF-16LE text of `size` bytes, as codecs.utf_16_le_decode(..., "surrogatepass") reads it.
    Names, namespaces and most values are ASCII: those (and Latin-1) are copied a byte a unit into
    a one-byte str, where CPython's UTF-16 decoder spends ~700 instructions a string on its
    general case (callgrind: a third of a bag's read)."""
    cdef Py_ssize_t units = size >> 1, k
    cdef unsigned char high = 0, low = 0
    cdef int order = -1  # little-endian
    cdef unsigned char* d
    for k in range(units):
        high |= s[2 * k + 1]
        low |= s[2 * k]
    if high:
        return PyUnicode_DecodeUTF16(<const char*>s, size, "surrogatepass", &order)
    # the str's kind must be exact: ASCII only where every unit is below 0x80
    text = PyUnicode_New(units, 0x7f if low < 0x80 else 0xff)
    d = <unsigned char*>PyUnicode_DATA(text)
    for k in range(units):
        d[k] = s[2 * k]
    return text


cdef Py_ssize_t _units(str name) except -2:
    """len(name.encode("utf-16-le")) // 2, as the Python reader checks a D4 key's prefix: a str of
    one-byte characters has one unit each; any other is encoded (its codec found by name each
    time, most of a D4 property's cost before), and raises on a lone surrogate as it does there."""
    if PyUnicode_KIND(name) == PyUnicode_1BYTE_KIND:
        return len(name)
    return len(name.encode("utf-16-le")) // 2


cdef class _Bag:
    cdef bytes data
    cdef const unsigned char* p
    cdef Py_ssize_t pos, size
    cdef int vt  # of the last value read
    cdef bint is_array

    def __cinit__(self, bytes data):
        self.data = data
        self.p = <const unsigned char*>(<char*>data)
        self.size = len(data)
        self.pos = 0

    cdef inline Py_ssize_t advance(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t pos = self.pos
        if n < 0 or pos + n > self.size:
            raise _Decline
        self.pos = pos + n
        return pos

    cdef inline int32_t i32(self) except? -1:
        return _i32(self.p + self.advance(4))

    cdef inline Py_ssize_t count(self) except -1:
        cdef int32_t n = self.i32()
        if n < 0 or n > _MAX_ITEMS or n > self.size - self.pos:
            raise _Decline
        return n

    cdef Py_ssize_t span(self, Py_ssize_t* size) except -1:
        """The next string's place: int32 byte length (including the 2-byte NUL), UTF-16LE, NUL;
        where its text starts, with its byte length (NUL excluded) in `size`."""
        cdef int32_t n = self.i32()
        cdef Py_ssize_t pos = self.pos, end
        if n < 2 or n % 2 or n > self.size - pos:
            raise _Decline
        end = pos + n
        if self.p[end - 2] or self.p[end - 1]:
            raise _Decline
        self.pos = end
        size[0] = n - 2
        return pos

    cdef str string(self):
        cdef Py_ssize_t size
        cdef Py_ssize_t pos = self.span(&size)
        return _utf16(self.p + pos, size)

    cdef object scalar(self, int vt):
        cdef const unsigned char* b
        if vt == 8 or vt == 14:  # BSTR; DECIMAL is stored as its text
            return self.string()
        if vt == 0 or vt == 1:
            return None
        if vt == 16 or vt == 17:
            b = self.p + self.advance(1)
            return <int8_t>b[0] if vt == 16 else b[0]
        if vt == 2 or vt == 11 or vt == 18:
            b = self.p + self.advance(2)
            if vt == 11:
                return <int16_t>_u16(b) != 0
            return <int16_t>_u16(b) if vt == 2 else _u16(b)
        if vt == 3 or vt == 10 or vt == 22:
            return _i32(self.p + self.advance(4))
        if vt == 19 or vt == 23:
            return <uint32_t>_i32(self.p + self.advance(4))
        if vt == 4:
            return PyFloat_Unpack4(<const char*>self.p + self.advance(4), 1)
        if vt == 5:
            return PyFloat_Unpack8(<const char*>self.p + self.advance(8), 1)
        if vt == 7:
            return _ole_date(PyFloat_Unpack8(<const char*>self.p + self.advance(8), 1))
        if vt == 20:
            return <int64_t>_u64(self.p + self.advance(8))
        if vt == 21:
            return _u64(self.p + self.advance(8))
        if vt == 6:  # CY: int64 in units of 1/10000
            return currency(<int64_t>_u64(self.p + self.advance(8)))
        raise _Decline

    cdef object property(self, str name, str namespace, int32_t ptype):
        value = self.value()
        cdef tuple args = ((name, namespace, self.vt, ptype, self.is_array, value),)
        return _TUPLE.tp_new(_PROPERTY, <PyObject*>args, NULL)

    cdef object value(self):
        """A property's VARIANT: its value, with its type and arrayness in `vt` and `is_array`."""
        cdef const unsigned char* b = self.p + self.advance(3)
        cdef int is_array = b[0]
        cdef int raw_vt = _u16(b + 1)
        cdef int vt = raw_vt & ~_VT_ARRAY
        cdef Py_ssize_t dims, total, i
        if is_array > 1 or (is_array != 0) != ((raw_vt & _VT_ARRAY) != 0):
            raise _Decline
        if not is_array:
            value = self.scalar(vt)
        else:
            dims = _u16(self.p + self.advance(2))
            if not 1 <= dims <= 8:
                raise _Decline
            total = 1
            for i in range(dims):
                total *= self.count()
                self.i32()  # lower bound
                if total > _MAX_ITEMS:
                    raise _Decline
            value = [self.scalar(vt) for i in range(total)]
        self.vt = vt
        self.is_array = is_array != 0
        return value


cdef class _Known:
    """A string as a bag before held it (its UTF-16 bytes and text), and, for a property's name,
    the namespace it was under, its header and which of the picked values it names."""
    cdef bytes raw
    cdef str text, namespace
    cdef object header  # None until a property so named was a header
    cdef int picks  # 1: the system MessageType, 2: the error report's, 3: the system InterchangeID


cdef int _MEMO_MAX = 512  # strings of a bag remembered, in the order the bag holds them


cdef int _picks(str name, str namespace):
    if name == "MessageType":
        return 1 if namespace == _SYSTEM_NS else 2 if namespace == _ERROR_NS else 0
    return 3 if name == "InterchangeID" and namespace == _SYSTEM_NS else 0


cdef class _Sink:
    """What a walk of a bag makes of each property: the property itself (decode_context), or its
    header and the values a message's fields pick (context_fields)."""
    cdef list props, unspelled
    cdef dict headers, names, space
    cdef str space_of  # the namespace `space` holds the names of (a C4 group's properties share its str)
    cdef object name_of
    cdef public object message_type, report_type, interchange
    cdef list memo  # _Known by place in the bag: the last bag's strings, for the next bag of the same layout

    cdef _Known recall(self, _Bag c, Py_ssize_t k, str namespace):
        """The bag's next string (`namespace` None) or property name (under `namespace`), as
        `c.string()` reads it, with what was known of it: the `k`th string of the last bag, where
        this bag holds the same bytes there (under the same namespace), else made and remembered.
        A queue's bags mostly share their names: no text made, hashed and looked up for them."""
        cdef Py_ssize_t size
        cdef Py_ssize_t pos = c.span(&size)
        cdef _Known known
        if k < len(self.memo):
            known = <_Known>self.memo[k]
            if (len(known.raw) == size and memcmp(PyBytes_AS_STRING(known.raw), c.p + pos, size) == 0
                    and (known.namespace is namespace or known.namespace == namespace)):
                return known
        known = _Known()
        known.raw = PyBytes_FromStringAndSize(<const char*>c.p + pos, size)
        known.text = _utf16(c.p + pos, size)
        known.namespace = namespace
        if namespace is not None:
            known.picks = _picks(known.text, namespace)
        if k < len(self.memo):
            self.memo[k] = known
        elif k == len(self.memo) and k < _MEMO_MAX:
            self.memo.append(known)
        return known

    cdef int take(self, _Bag c, str name, str namespace, int32_t ptype, _Known known=None) except -1:
        if self.props is not None:
            self.props.append(c.property(name, namespace, ptype))
            return 0
        value = c.value()
        # biztalk.py's ctx: the last property of a (namespace, name) holds its value
        cdef int picks = _picks(name, namespace) if known is None else known.picks
        if picks == 1:
            self.message_type = value
        elif picks == 2:
            self.report_type = value
        elif picks == 3:
            self.interchange = value
        if ptype & (1 | 2 | 16):  # written, promoted, was-promoted
            header = None if known is None else known.header
            if header is None:
                if namespace is not self.space_of:
                    self.space = self.names.get(namespace)
                    self.space_of = namespace
                header = None if self.space is None else self.space.get(name)
                if header is None:
                    header = self.name_of(namespace, name)
                    self.space_of = None  # name_of may have made the namespace's names
                if known is not None:
                    known.header = header
            text = _text(value)
            if text is None:  # spelled once the whole bag has read: a bag that does not read is not spelled
                self.unspelled.append((header, value))
                text = value
            self.headers[header] = text
        return 0


cdef inline object _text(object value):
    """text_of(value), in C for the kinds most bags hold (its answers: a bool as true/false, an
    int in decimal, None as nothing); None for the others."""
    if type(value) is str:
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return str(value)
    if value is None:
        return ""
    return None


cdef str _SYSTEM_NS = SYSTEM_NS
cdef str _ERROR_NS = ERROR_NS


cdef object _walk(object blob, _Sink sink):
    """The bag's layout with every property given to `sink`; None where the Python reader decides."""
    cdef _Bag c = _Bag(bytes(blob))
    cdef Py_ssize_t i, j, namespaces, count, k = 0
    cdef int32_t prefix, ptype
    cdef _Known known
    try:
        clsid = c.data[:16]
        c.advance(16)
        if clsid == CLSID_C4 and sink.memo is not None:
            namespaces = c.count()
            for i in range(namespaces):
                namespace = sink.recall(c, k, None).text
                k += 1
                count = c.count()
                for j in range(count):
                    known = sink.recall(c, k, namespace)
                    k += 1
                    ptype = c.i32()
                    sink.take(c, known.text, namespace, ptype, known)
            layout = "C4"
        elif clsid == CLSID_C4:
            namespaces = c.count()
            for i in range(namespaces):
                namespace = c.string()
                count = c.count()
                for j in range(count):
                    name = c.string()
                    ptype = c.i32()
                    sink.take(c, name, namespace, ptype)
            layout = "C4"
        elif clsid == CLSID_D4:
            count = c.count()
            for i in range(count):
                prefix = c.i32()
                key = c.string()
                ptype = c.i32()
                name, sep, namespace = key.partition("^")
                sink.take(c, name, namespace, ptype)
                if sep and prefix != _units(name):
                    raise _Decline
            layout = "D4"
        else:
            return None
        if c.pos != c.size:
            return None
    except (_Decline, ValueError, OverflowError):
        return None
    return layout


def decode_context(blob):
    """biztalk.decode_context's (layout, properties) of a bag that follows the layout; None for
    anything else (the Python reader then says what is wrong)."""
    cdef _Sink sink = _Sink()
    sink.props = []
    layout = _walk(blob, sink)
    return None if layout is None else (layout, sink.props)


def context_fields(blob, dict names, name_of, text_of, list memo=None):
    """What BizTalkSource makes of a bag, without its properties: (headers, the system
    MessageType, the error report's MessageType, the InterchangeID), as biztalk.context_fields
    makes them from decode_context's properties; None where that reader decides. `names` maps
    namespace -> property -> header name; `name_of(namespace, property)` names the others;
    `text_of(value)` spells a value that is not a str. `memo`, where given, holds what the reader
    knew of the last bag's strings for the next: the caller's, empty at first and again whenever
    the header names `names` and `name_of` give change."""
    cdef _Sink sink = _Sink()
    sink.headers = {}
    sink.memo = memo
    sink.names = names
    sink.name_of = name_of
    sink.unspelled = []
    if _walk(blob, sink) is None:
        return None
    for header, value in sink.unspelled:  # each, in order, as the Python reader spells (and fails on) them
        text = text_of(value)
        if sink.headers[header] is value:  # not since replaced by a property that came again
            sink.headers[header] = text
    return sink.headers, sink.message_type, sink.report_type, sink.interchange


cdef inline bint _header(const unsigned char* p, Py_ssize_t pos, Py_ssize_t n, int32_t* flag, int32_t* size,
                         int32_t* stored) noexcept:
    """A block's header at `pos` read into flag, size, stored; False when fewer than 12 bytes are left."""
    if n - pos < 12:
        return False
    flag[0] = _i32(p + pos)
    size[0] = _i32(p + pos + 4)
    stored[0] = _i32(p + pos + 8)
    return True


def decode_blocks(blob):
    """biztalk.decode_blocks of a fragment that follows the layout: the very same bytes; None for
    any other (the Python reader then says what is wrong). A first walk checks the blocks' headers
    and sums their sizes; the second inflates each block straight into the part's bytes, with one
    zlib stream reset between blocks, where the Python reader makes a decompressor a block and
    joins the pieces."""
    cdef bytes data = bytes(blob)
    cdef const unsigned char* p = <const unsigned char*>(<char*>data)
    cdef Py_ssize_t n = len(data), pos = 0, total = 0, at = 0
    cdef int32_t flag = 0, size = 0, stored = 0
    cdef z_stream zs
    cdef bint ready = False
    cdef unsigned char* dst
    if n == 0:
        return b""  # DtaSpy's writer stores an empty part as no bytes at all
    while True:
        if not _header(p, pos, n, &flag, &size, &stored):
            return None
        pos += 12
        if flag == 0 and size == 0 and stored == 0:
            break
        if (flag != 0 and flag != 1) or not 0 < size <= _MAX_BLOCK or not 0 < stored <= _MAX_BLOCK:
            return None
        if stored > n - pos or (flag == 0 and stored != size):
            return None
        pos += stored
        total += size
        if total > _MAX_PART:
            return None
    if pos != n:
        return None
    out = PyBytes_FromStringAndSize(NULL, total)
    dst = <unsigned char*>PyBytes_AS_STRING(out)
    memset(&zs, 0, sizeof(zs))
    pos = 0
    try:
        while True:
            _header(p, pos, n, &flag, &size, &stored)
            pos += 12
            if flag == 0 and size == 0 and stored == 0:
                return out
            if flag == 0:
                memcpy(dst + at, p + pos, size)
            else:
                if not ready:
                    if inflateInit(&zs) != Z_OK:
                        raise MemoryError("zlib could not start an inflate stream")
                    ready = True
                elif inflateReset(&zs) != Z_OK:
                    return None
                zs.next_in = <unsigned char*>(p + pos)
                zs.avail_in = <unsigned int>stored
                zs.next_out = dst + at
                zs.avail_out = <unsigned int>size
                # the stream must end having made exactly `size` bytes, as the Python reader's
                # decompress(chunk, size + 1) and its eof check hold it; bytes after its end are
                # left unread there too (unused_data)
                if inflate(&zs, Z_FINISH) != Z_STREAM_END or zs.avail_out != 0:
                    return None
            at += size
            pos += stored
    finally:
        if ready:
            inflateEnd(&zs)
