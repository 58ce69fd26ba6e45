"""Legacy column values as JSON: bytes in base64, times in ISO 8601."""

from __future__ import annotations

import base64
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID


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
