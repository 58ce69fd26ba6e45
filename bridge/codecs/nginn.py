"""NGinn.MessageBus formats: `key=value|...` headers, `sql://alias/Table` endpoints,
Newtonsoft `$type` bodies, and .NET `Exception.ToString()` text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import orjson

from bridge.errors import BadRow

HDR_REPLY_TO = "_NG-ReplyTo"
HDR_TTL = "_NG-TTL"
HDR_MSG_TYPE = "_NG_MsgType"
HDR_CORRELATION = "_NG-CorrelationId"
HDR_LABEL = "_NG-Label"
HDR_CONTENT_TYPE = "_NG-ContentType"
HDR_DELIVER_AT = "_NG-DeliverAt"
HDR_BUS_MESSAGE_ID = "_NG-BusMessageId"
HDR_RETRY_COUNT = "_NG_RetryCount"
# Headers NGinn keeps in columns or that qbridge turns into NServiceBus fields; the rest pass through.
TRANSLATED = frozenset(
    {HDR_REPLY_TO, HDR_TTL, HDR_MSG_TYPE, HDR_CORRELATION, HDR_LABEL, HDR_CONTENT_TYPE,
     HDR_DELIVER_AT, HDR_BUS_MESSAGE_ID, HDR_RETRY_COUNT}
)


def parse_headers(text: str | None) -> dict[str, str]:
    """NGinn's `StringToHeaders`: split on `|`, each pair on `=`, both sides trimmed.

    NGinn itself throws on a pair that does not split into exactly two parts (a value
    containing `=`, or no `=` at all); such a row is unreadable, so it is a BadRow here too.
    """
    headers: dict[str, str] = {}
    if not text:
        return headers
    for pair in text.split("|"):
        if not pair:
            continue
        parts = pair.split("=")
        if len(parts) != 2:
            what = "has no '='" if len(parts) == 1 else "contains more than one '='"
            raise BadRow(f"msg_headers: header pair {pair[:80]!r} {what} (NGinn's format is key=value|key=value)")
        headers[parts[0].strip()] = parts[1].strip()
    return headers


@lru_cache(maxsize=4096)  # a queue's rows name a handful of endpoints, each many times
def endpoint_queue(endpoint: str | None) -> str | None:
    """`sql://alias/Table` -> `Table`; None for an empty or non-sql endpoint."""
    if not endpoint:
        return None
    if not endpoint.startswith("sql://"):
        return None
    parts = endpoint[len("sql://"):].split("/")
    if len(parts) != 2 or not parts[1]:
        return None
    return parts[1]


def parse_local_time(text: str) -> datetime:
    """`yyyy-MM-dd HH:mm:ss`, the format of `_NG-TTL` (server-local time)."""
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise BadRow(f"header {HDR_TTL}: {text!r} is not 'yyyy-MM-dd HH:mm:ss'") from None


def body_type(body: str | None) -> str | None:
    """The root `$type` of a Newtonsoft body (TypeNameHandling.Objects puts it on every object)."""
    if body is None:
        raise BadRow("msg_text is NULL: NGinn never writes a message without a body")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRow(f"msg_text is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        return None
    value = doc.get("$type")
    if value is not None and not isinstance(value, str):
        raise BadRow("msg_text: '$type' is not a string")
    return value or None


@dataclass(frozen=True)
class ExceptionText:
    exception_type: str
    message: str
    inner_exception_type: str | None


# `Namespace.TypeName: message`, optionally with generic arity or nested `+` names.
_FIRST = re.compile(r"^(?P<type>[A-Za-z_][\w.`+\[\],]*?)(?:: (?P<msg>.*))?$", re.DOTALL)
_INNER = re.compile(r" ---> (?P<type>[A-Za-z_][\w.`+]*)(?::|$)", re.MULTILINE)
_STACK_LINE = re.compile(r"^\s+at |^\s+--- End of inner exception stack trace ---", re.MULTILINE)


def parse_exception(text: str | None) -> ExceptionText:
    """Type, message and inner type out of .NET's `Exception.ToString()`.

    The layout is `Type: Message` up to the first ` ---> Inner` or `   at ` line; a text that
    does not start like that keeps its first line as the message and an unknown type.
    """
    if not text or not text.strip():
        return ExceptionText("Unknown", "NGinn recorded no error information", None)
    stack = _STACK_LINE.search(text)
    head = text[: stack.start()] if stack else text
    head = head.rstrip()
    inner = _INNER.search(text)
    inner_type = inner.group("type") if inner else None
    if inner and inner.start() < len(head):
        head = head[: inner.start()]
    m = _FIRST.match(head.strip())
    if m and "." in m.group("type") and " " not in m.group("type"):
        message = (m.group("msg") or "").strip()
        return ExceptionText(m.group("type"), message, inner_type)
    return ExceptionText("Unknown", head.strip().splitlines()[0] if head.strip() else "", inner_type)
