# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The root `$type` of JSON message bodies, compiled by the machine's C compiler at install
(issue 49): what bridge.sources.nginn_lane._body_types makes of a body with orjson, without
making the body's objects (orjson.loads of a 583-byte body with ten nested objects: 1.3 µs).

One-sided by design: a body is answered here only when it is a JSON object this scanner reads
whole and is sure of (RFC 8259's grammar, a subset of what orjson reads). Anything else (a number
in exponent form or of more than 15 digits, a \\u escape of a surrogate, an escape in a root key
or in the `$type` string, nesting deeper than 64, a root that is not an object, any byte the
grammar does not allow) is DEFER, and the caller asks orjson, which decides. tests/codecs hold
every answer given here to orjson's on hypothesis-made and mutated bodies.
"""

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL
    object PyUnicode_DecodeUTF8(const char*, Py_ssize_t, const char*)

DEFER = object()  # not answered here: orjson decides

cdef enum:
    MAX_DEPTH = 64
    MAX_DIGITS = 15


cdef class _Scan:
    cdef const unsigned char* p
    cdef Py_ssize_t n, i
    cdef Py_ssize_t type_at, type_len  # the root `$type` string's bytes (the last one), -1: none
    cdef bint type_other  # the last root `$type` is not a string

    cdef inline void ws(self) noexcept:
        cdef unsigned char c
        while self.i < self.n:
            c = self.p[self.i]
            if c == 32 or c == 9 or c == 10 or c == 13:
                self.i += 1
            else:
                return

    cdef int string(self, bint plain) noexcept:
        """A string from its opening quote; 1: read (`plain`: and it held no escape), 0: defer."""
        cdef unsigned char c
        cdef int k, hexval, d
        self.i += 1
        while self.i < self.n:
            c = self.p[self.i]
            if c == 34:  # "
                self.i += 1
                return 1
            if c < 32:
                return 0
            if c == 92:  # backslash
                if plain or self.i + 1 >= self.n:
                    return 0
                c = self.p[self.i + 1]
                if c == 117:  # \uXXXX, not a surrogate
                    if self.i + 6 > self.n:
                        return 0
                    hexval = 0
                    for k in range(2, 6):
                        d = self.p[self.i + k]
                        if 48 <= d <= 57:
                            d -= 48
                        elif 97 <= d <= 102:
                            d -= 87
                        elif 65 <= d <= 70:
                            d -= 55
                        else:
                            return 0
                        hexval = hexval * 16 + d
                    if 0xD800 <= hexval <= 0xDFFF:
                        return 0
                    self.i += 6
                    continue
                if c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
                    self.i += 2
                    continue
                return 0
            self.i += 1
        return 0

    cdef int number(self) noexcept:
        cdef Py_ssize_t digits = 0
        if self.p[self.i] == 45:  # -
            self.i += 1
        if self.i >= self.n:
            return 0
        if self.p[self.i] == 48:  # a leading 0 stands alone
            self.i += 1
            digits = 1
        else:
            while self.i < self.n and 48 <= self.p[self.i] <= 57:
                self.i += 1
                digits += 1
            if digits == 0:
                return 0
        if self.i < self.n and self.p[self.i] == 46:  # .
            self.i += 1
            if self.i >= self.n or not 48 <= self.p[self.i] <= 57:
                return 0
            while self.i < self.n and 48 <= self.p[self.i] <= 57:
                self.i += 1
                digits += 1
        if digits > MAX_DIGITS:
            return 0
        if self.i < self.n and (self.p[self.i] == 101 or self.p[self.i] == 69):  # an exponent: orjson decides
            return 0
        return 1

    cdef int word(self, const char* w, Py_ssize_t k) noexcept:
        cdef Py_ssize_t j
        if self.i + k > self.n:
            return 0
        for j in range(k):
            if self.p[self.i + j] != <unsigned char>w[j]:
                return 0
        self.i += k
        return 1

    cdef int value(self, int depth) noexcept:
        cdef unsigned char c
        if self.i >= self.n:
            return 0
        c = self.p[self.i]
        if c == 34:
            return self.string(False)
        if c == 123:
            return self.obj(depth + 1, False)
        if c == 91:
            return self.array(depth + 1)
        if c == 116:
            return self.word("true", 4)
        if c == 102:
            return self.word("false", 5)
        if c == 110:
            return self.word("null", 4)
        if c == 45 or 48 <= c <= 57:
            return self.number()
        return 0

    cdef int array(self, int depth) noexcept:
        if depth > MAX_DEPTH:
            return 0
        self.i += 1
        self.ws()
        if self.i < self.n and self.p[self.i] == 93:  # ]
            self.i += 1
            return 1
        while True:
            self.ws()
            if not self.value(depth):
                return 0
            self.ws()
            if self.i >= self.n:
                return 0
            if self.p[self.i] == 44:  # ,
                self.i += 1
                continue
            if self.p[self.i] == 93:
                self.i += 1
                return 1
            return 0

    cdef int obj(self, int depth, bint root) noexcept:
        cdef Py_ssize_t key_at, key_len, at
        cdef bint is_type
        if depth > MAX_DEPTH:
            return 0
        self.i += 1
        self.ws()
        if self.i < self.n and self.p[self.i] == 125:  # }
            self.i += 1
            return 1
        while True:
            self.ws()
            if self.i >= self.n or self.p[self.i] != 34:
                return 0
            key_at = self.i + 1
            if not self.string(root):  # a root key with an escape: orjson decides
                return 0
            key_len = self.i - 1 - key_at
            is_type = root and key_len == 5 and self.p[key_at] == 36 and self.p[key_at + 1] == 116 \
                and self.p[key_at + 2] == 121 and self.p[key_at + 3] == 112 and self.p[key_at + 4] == 101  # $type
            self.ws()
            if self.i >= self.n or self.p[self.i] != 58:  # :
                return 0
            self.i += 1
            self.ws()
            if is_type:
                at = self.i
                if self.i < self.n and self.p[self.i] == 34:
                    if not self.string(True):  # an escape in the type: orjson decides
                        return 0
                    self.type_at, self.type_len, self.type_other = at + 1, self.i - at - 2, False
                else:
                    if not self.value(depth):
                        return 0
                    # null is no type (doc.get("$type") is None); anything else is not a string
                    self.type_at, self.type_len = -1, 0
                    self.type_other = not (self.i - at == 4 and self.p[at] == 110)
            elif not self.value(depth):
                return 0
            self.ws()
            if self.i >= self.n:
                return 0
            if self.p[self.i] == 44:
                self.i += 1
                continue
            if self.p[self.i] == 125:
                self.i += 1
                return 1
            return 0


cdef object _root_type(str text):
    cdef _Scan s = _Scan()
    cdef Py_ssize_t n
    try:
        s.p = <const unsigned char*>PyUnicode_AsUTF8AndSize(text, &n)
    except UnicodeError:  # a lone surrogate: no UTF-8 (orjson refuses it too, and says so)
        return DEFER
    s.n, s.i, s.type_at, s.type_len, s.type_other = n, 0, -1, 0, False
    s.ws()
    if s.i >= s.n or s.p[s.i] != 123 or not s.obj(1, True):
        return DEFER
    s.ws()
    if s.i != s.n:
        return DEFER
    if s.type_other:
        return None
    if s.type_at < 0:
        return ""
    return PyUnicode_DecodeUTF8(<const char*>s.p + s.type_at, s.type_len, NULL)


def root_types(list texts, list ok):
    """For each body whose `ok` is true: its root `$type` (a str), "" for none, None where the
    `$type` is not a string, or DEFER; None where `ok` is false. With the places of the DEFERs."""
    cdef Py_ssize_t i, n = len(texts)
    cdef list out = [None] * n
    cdef list deferred = []
    for i in range(n):
        if not ok[i]:
            continue
        text = texts[i]
        if type(text) is not str:
            out[i] = DEFER
            deferred.append(i)
            continue
        got = _root_type(<str>text)
        out[i] = got
        if got is DEFER:
            deferred.append(i)
    return out, deferred
