"""Legacy column values as JSON: bytes in base64, times in ISO 8601; text every column stores."""

from __future__ import annotations

import base64
import re
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson


def json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (Decimal, UUID)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return repr(value)


def restore(value: Any, time: bool = False) -> Any:
    """`json_safe` undone: base64 objects become bytes again, and a column known to hold times
    (`time`) an ISO 8601 string a datetime (naive or aware, as it was read)."""
    if isinstance(value, dict):
        if set(value) == {"base64"}:
            return base64.b64decode(value["base64"])
        return {k: restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore(v) for v in value]
    if time and isinstance(value, str):
        return datetime.fromisoformat(value)
    return value


def writable(text: str) -> str:
    """`text` as every text column stores it: a lone UTF-16 surrogate (which Java and BizTalk
    strings may hold, and no UTF-8 encoder takes) and a NUL (which PostgreSQL's text refuses)
    written as escapes."""
    if text.isascii() and "\x00" not in text:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def raw_json(raw: Any, ascii: bool = False) -> str:
    """A kept raw row as JSON text; a lone surrogate, which no UTF-8 encoder takes, is kept as the
    text of its escape. `ascii`: every character beyond ASCII a `\\uXXXX` escape, which reads back
    the same, for a database whose character set refuses one (a reverse job keeps its quarantine
    in the legacy database, which may be utf8mb3 or Latin-1): a quarantined row must be kept."""
    try:
        text = orjson.dumps(raw).decode()
    except TypeError:
        text = orjson.dumps(_writable_values(raw)).decode()
    return text if not ascii or text.isascii() else _NOT_ASCII.sub(_escape, text)


def ascii_text(text: str) -> str:
    """`writable(text)` in ASCII: the fallback for a reason a column's character set refuses."""
    return writable(text).encode("ascii", "backslashreplace").decode("ascii")


_NOT_ASCII = re.compile(r"[^\x00-\x7f]")


def _escape(m: re.Match[str]) -> str:
    """A character of JSON string text as its \\u escape (two, a surrogate pair, beyond the BMP)."""
    code = ord(m.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _writable_values(value: Any) -> Any:
    if isinstance(value, str):  # JSON escapes a NUL itself
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_writable_values(str(k)): _writable_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_writable_values(v) for v in value]
    return value
