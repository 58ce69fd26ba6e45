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

from bridge.codecs.biztalk_values import (CLSID_C4, CLSID_D4, ERROR_NS, MAX_ITEMS, SYSTEM_NS, VT_ARRAY, ContextProperty,
                                          currency, ole_date)

cdef extern from "Python.h":
    double PyFloat_Unpack4(const char* p, int le) except? -1.0
    double PyFloat_Unpack8(const char* p, int le) except? -1.0


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
        if n < 0 or n > MAX_ITEMS or n > self.size - self.pos:
            raise _Decline
        return n

    cdef str string(self):
        """int32 byte length (including the 2-byte NUL), UTF-16LE, NUL."""
        cdef int32_t n = self.i32()
        cdef Py_ssize_t pos = self.pos, end
        cdef int order = -1  # little-endian
        if n < 2 or n % 2 or n > self.size - pos:
            raise _Decline
        end = pos + n
        if self.p[end - 2] or self.p[end - 1]:
            raise _Decline
        self.pos = end
        return PyUnicode_DecodeUTF16(<const char*>self.p + pos, n - 2, "surrogatepass", &order)

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
        cdef int vt = raw_vt & ~VT_ARRAY
        cdef Py_ssize_t dims, total, i
        if is_array > 1 or (is_array != 0) != ((raw_vt & VT_ARRAY) != 0):
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
                if total > MAX_ITEMS:
                    raise _Decline
            value = [self.scalar(vt) for i in range(total)]
        self.vt = vt
        self.is_array = is_array != 0
        return value


cdef class _Sink:
    """What a walk of a bag makes of each property: the property itself (decode_context), or its
    header and the values a message's fields pick (context_fields)."""
    cdef list props, unspelled
    cdef dict headers, names
    cdef object name_of
    cdef public object message_type, report_type, interchange

    cdef int take(self, _Bag c, str name, str namespace, int32_t ptype) except -1:
        if self.props is not None:
            self.props.append(c.property(name, namespace, ptype))
            return 0
        value = c.value()
        # biztalk.py's ctx: the last property of a (namespace, name) holds its value
        if name == "MessageType":
            if namespace == _SYSTEM_NS:
                self.message_type = value
            elif namespace == _ERROR_NS:
                self.report_type = value
        elif name == "InterchangeID" and namespace == _SYSTEM_NS:
            self.interchange = value
        if ptype & (1 | 2 | 16):  # written, promoted, was-promoted
            key = (namespace, name)
            header = self.names.get(key)
            if header is None:
                header = self.name_of(namespace, name)
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
    cdef Py_ssize_t i, j, namespaces, count
    cdef int32_t prefix, ptype
    try:
        clsid = c.data[:16]
        c.advance(16)
        if clsid == CLSID_C4:
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
                if sep and prefix != len(name.encode("utf-16-le")) // 2:
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


def context_fields(blob, dict names, name_of, text_of):
    """What BizTalkSource makes of a bag, without its properties: (headers, the system
    MessageType, the error report's MessageType, the InterchangeID), as biztalk.context_fields
    makes them from decode_context's properties; None where that reader decides. `names` maps
    (namespace, property) to a header name; `name_of(namespace, property)` names the others;
    `text_of(value)` spells a value that is not a str."""
    cdef _Sink sink = _Sink()
    sink.headers = {}
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
