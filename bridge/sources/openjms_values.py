"""OpenJMS values as NServiceBus sees them: JMS property values as header text and JSON, Java's
epoch milliseconds as times, and the content type of each JMS message type."""

from __future__ import annotations

import functools
import struct
from datetime import datetime
from typing import Any

from bridge.errors import BadRow
from bridge.timefmt import UTC

DEFAULT_TYPES = {"Message", "TextMessage", "BytesMessage", "MapMessage", "StreamMessage", "ObjectMessage"}
CONTENT_TYPES = {
    "TextMessage": "text/plain; charset=utf-8",
    "BytesMessage": "application/octet-stream",
    "ObjectMessage": "application/x-java-serialized-object",
    "MapMessage": "application/json; jms-body=map",
    "StreamMessage": "application/json; jms-body=stream",
}


def epoch_ms(value: int, what: str = "timestamp") -> datetime:
    """Java's milliseconds since 1970 as UTC; a value no calendar holds makes the row a BadRow."""
    try:
        return datetime.fromtimestamp(value / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        raise BadRow(f"{what} {value} ms since 1970 is outside the years 1-9999") from None


def property_text(prop: dict[str, Any]) -> str:
    """A JMS property value as header text that reads back to the same Java value."""
    kind = prop["type"]
    value: Any = prop.get("value")  # its Python type follows `kind`
    if kind is None:
        return ""
    if kind == "byte[]":
        return prop["base64"]
    if kind == "java.lang.Boolean":
        return "true" if value else "false"
    if kind == "java.lang.Float":
        return _float32(value)
    return str(value)


_F32 = struct.Struct(">f")


def _float32(value: float) -> str:
    return _float32_text(_F32.pack(value))


# A queue's float properties repeat (a rate, a version): each is spelled once, by its bits, so that
# 0.0 and -0.0 (equal as keys) keep their own texts. Its search cost 5% of an OpenJMS pass (py-spy).
@functools.lru_cache(maxsize=4096)
def _float32_text(packed: bytes) -> str:
    value = _F32.unpack(packed)[0]
    for digits in range(1, 10):  # the shortest text that is the same float, as Java prints it
        text = f"{value:.{digits}g}"
        try:
            if _F32.pack(float(text)) == packed:
                return text
        except OverflowError:  # a text past the largest float32 (3.403e+38 of Float.MAX_VALUE): not the same float
            continue
    return repr(value)


def json_value(prop: dict[str, Any]) -> Any:
    """A JMS property value as a JSON value (a byte array as its base64 text)."""
    return prop["base64"] if prop["type"] == "byte[]" else prop.get("value")
