"""OpenJMS `messages.messageBlob` read along OpenJMS's own writeExternal layouts: the fast path
of `openjms_blob.decode`.

The generic reader (javaser, then openjms_blob) spent ~140 µs a blob building every object of
the stream before reading it, which held OpenJMS migration at ~4,500 handles/s (issue 27). This
one walks the stream once (javaser_walk), in the order OpenJMS writes it: the header fields,
the properties HashMap and each body kind (shared/fixtures/openjms/README.md).

It answers only where the generic reader gives the same answer: it is stricter, never looser.
Anything else (a class or layout it does not expect, block data cut where the layout has none,
data after a payload, a back-reference to an unexpected object, a decode error) makes `read`
return None, and the caller asks the generic reader, which then also words any error.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from typing import Any

from bridge.codecs.javaser import MAGIC, MAX_HANDLES, TC_ENDBLOCKDATA, TC_OBJECT, mutf8, utf16
from bridge.codecs.javaser_walk import BOXED, BYTES, EXTERNAL_FLAGS, MAP, PENDING, Decline, Walker, int_at, long_at

MESSAGE = "org.exolab.jms.message."
CLIENT = "org.exolab.jms.client."
_H = struct.Struct(">H").unpack_from
_MESSAGE_HEAD = struct.Struct(">q??qq").unpack_from  # version, readOnly, processed, acceptedTime, sequenceNumber
_REDELIVERED = struct.Struct(">?q").unpack_from  # redelivered, expiration
_LEAF_LONG = struct.Struct(">qq").unpack_from
_LEAF_INT = struct.Struct(">qi").unpack_from
_DESTINATION = struct.Struct(">qq?qi").unpack_from  # JmsQueue|JmsTopic, JmsDestination, persistent, DestinationImpl, nchars
_DESTINATION_SIZE = 29
# Tags of what the handle of an OpenJMS object holds, beside javaser_walk's (compared by identity;
# the leaf classes are tagged by their class-name constants below).
_HEADER, _PROPERTIES, _DEST = "header", "properties", "destination"


class _Reader(Walker):
    __slots__ = ()

    def message(self) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        data = self.data
        if not data.startswith(MAGIC) or data[4] != TC_OBJECT:
            raise Decline
        self.pos = 5
        entry = self.classdesc()
        if entry is None or entry[1][0].flags & EXTERNAL_FLAGS != EXTERNAL_FLAGS:
            raise Decline
        java_class = entry[1][0].name
        body_reader = _BODIES.get(java_class)
        if body_reader is None:
            raise Decline
        self.handles.append(PENDING)
        buf, at = self.fixed(26)
        _, read_only, processed, accepted, sequence = _MESSAGE_HEAD(buf, at)
        header = self.tagged(_HEADER)
        if header is None:
            raise Decline
        headers, more = header
        properties = self.tagged(_PROPERTIES) or {}
        body = body_reader(self)
        if data[self.pos] != TC_ENDBLOCKDATA or self.pos + 1 != self.end or len(self.handles) > MAX_HANDLES:
            raise Decline
        internal = {"readOnly": read_only, "processed": processed, "acceptedTime": accepted, "sequenceNumber": sequence,
                    **more}
        return java_class, headers, properties, body, internal

    def header(self) -> tuple[str, tuple[dict[str, Any], dict[str, Any]]]:
        self.fixed(8)
        reply_to = self.destination()
        timestamp = self.tagged(_TIMESTAMP)
        correlation = self.tagged(_CORRELATION)
        buf, at = self.fixed(9)
        redelivered, expiration = _REDELIVERED(buf, at)
        priority = self.tagged(_PRIORITY)
        jms_type = self.tagged(_TYPE)
        destination = self.destination()
        mode = self.tagged(_DELIVERY_MODE)
        message_id = self.tagged(_MESSAGE_ID)
        wildcard = self.text_or_null()
        unused = self.text_or_null()
        buf, at = self.fixed(8)
        headers = {
            "JMSMessageID": message_id, "JMSCorrelationID": correlation, "JMSReplyTo": reply_to,
            "JMSDestination": destination, "JMSType": jms_type, "JMSDeliveryMode": mode, "JMSPriority": priority,
            "JMSTimestamp": timestamp, "JMSExpiration": expiration, "JMSRedelivered": redelivered,
        }
        return _HEADER, (headers, {"wildcard": wildcard, "consumerId": long_at(buf, at)[0], "consumerIdString": unused})

    def destination(self) -> dict[str, Any] | None:
        held = self.tagged(_DEST)
        return None if held is None else dict(held)  # a shared destination still gives each header its own dict

    def properties(self) -> tuple[str, dict[str, dict[str, Any]]]:
        self.fixed(8)
        entries = self.tagged(MAP)
        return _PROPERTIES, {} if entries is None else {k: _typed(v) for k, v in entries.items()}

    def message_id_at(self, buf: bytes, at: int, end: int) -> str:
        """A MessageId payload from `at`: version 1 (pre-0.7.6) holds a String object after the
        block, later versions a writeUTF."""
        if end - at < 8:
            raise Decline
        if long_at(buf, at)[0] == 1:
            value = self.text_or_null() if end - at == 8 else None
            if value is None:
                raise Decline
            return value if value.startswith("ID:") else "ID:" + value
        if end - at < 10 or at + 10 + _H(buf, at + 8)[0] != end:
            raise Decline
        return mutf8(buf[at + 10:end])

    def chars_at(self, buf: bytes, at: int, end: int) -> str:
        """`int n` then n UTF-16 code units, filling the segment to `end`."""
        n = int_at(buf, at)[0]
        if n < 0 or at + 4 + 2 * n != end:
            raise Decline
        return utf16(buf[at + 4:end])


def _typed(value: Any) -> dict[str, Any]:
    """A property or map value in the manifests' convention (openjms_blob.typed)."""
    if value is None:
        return {"type": None, "value": None}
    if type(value) is str:
        return {"type": "java.lang.String", "value": value}
    if type(value) is tuple:
        if value[0] is BOXED:
            return {"type": value[1][0], "value": value[1][1]}
        if value[0] is BYTES:
            return {"type": "byte[]", "base64": base64.b64encode(value[1]).decode("ascii")}
    raise Decline


# -- the OpenJMS classes: payload readers --------------------------------------------------------
_TIMESTAMP, _PRIORITY, _DELIVERY_MODE = MESSAGE + "Timestamp", MESSAGE + "Priority", MESSAGE + "DeliveryModeImpl"
_TYPE, _MESSAGE_ID, _CORRELATION = MESSAGE + "Type", MESSAGE + "MessageId", MESSAGE + "CorrelationId"


def _leaf_long(tag: str) -> Callable[[_Reader], tuple[str, int]]:
    def read(r: _Reader) -> tuple[str, int]:
        return tag, _LEAF_LONG(*r.fixed(16))[1]
    return read


def _leaf_int(tag: str) -> Callable[[_Reader], tuple[str, int]]:
    def read(r: _Reader) -> tuple[str, int]:
        return tag, _LEAF_INT(*r.fixed(12))[1]
    return read


def _type(r: _Reader) -> tuple[str, str]:
    buf, start, end = r.segment()
    if end - start < 12:
        raise Decline
    return _TYPE, r.chars_at(buf, start + 8, end)


def _message_id(r: _Reader) -> tuple[str, str]:
    return _MESSAGE_ID, r.message_id_at(*r.segment())


def _correlation(r: _Reader) -> tuple[str, str]:
    buf, start, end = r.segment()
    if end - start < 16:
        raise Decline
    usage = int_at(buf, start + 8)[0]
    if usage == 1:  # APPLICATION_USE: the application's own string
        return _CORRELATION, r.chars_at(buf, start + 12, end)
    if usage == 2:  # PROVIDER_USE: a message id, embedded without an object header
        return _CORRELATION, r.message_id_at(buf, start + 12, end)
    raise Decline


def _destination(java_class: str, kind: str, temporary: bool) -> Callable[[_Reader], tuple[str, dict[str, Any]]]:
    def read(r: _Reader) -> tuple[str, dict[str, Any]]:
        buf, at, end = r.segment()
        connection: Any = None
        if temporary:
            if end - at < 8:
                raise Decline
            if long_at(buf, at)[0] >= 2:  # 0.7.7: a long connection id
                if end - at < 16:
                    raise Decline
                connection = long_at(buf, at + 8)[0]
                at += 16
            else:  # 0.7.6.1: a String, between two blocks
                if end - at != 8:
                    raise Decline
                connection = r.text_or_null()
                buf, at, end = r.segment()
        if end - at < _DESTINATION_SIZE:
            raise Decline
        persistent = _DESTINATION(buf, at)[2]
        out = {"java_class": java_class, "name": r.chars_at(buf, at + 25, end), "kind": kind,
               "temporary": temporary, "persistent": persistent}
        if temporary:
            out["connectionId"] = connection
        return _DEST, out
    return read


def _text(r: _Reader) -> dict[str, Any]:
    r.fixed(8)
    return {"text": r.text_or_null()}


def _map(r: _Reader) -> dict[str, Any]:
    r.fixed(8)
    entries = r.tagged(MAP)
    return {"map": {} if entries is None else {k: _typed(v) for k, v in entries.items()}}


def _raw(r: _Reader) -> bytes:
    buf, start, end = r.segment()
    if end - start < 12 or start + 12 + int_at(buf, start + 8)[0] != end:
        raise Decline
    return buf[start + 12:end]


_Reader.EXTERNAL = {
    MESSAGE + "MessageHeader": _Reader.header,
    MESSAGE + "MessageProperties": _Reader.properties,
    _TIMESTAMP: _leaf_long(_TIMESTAMP),
    _PRIORITY: _leaf_int(_PRIORITY),
    _DELIVERY_MODE: _leaf_int(_DELIVERY_MODE),
    _TYPE: _type,
    _MESSAGE_ID: _message_id,
    _CORRELATION: _correlation,
    **{CLIENT + name: _destination(CLIENT + name, kind, name.startswith("JmsTemporary"))
       for name, kind in (("JmsQueue", "queue"), ("JmsTopic", "topic"),
                          ("JmsTemporaryQueue", "queue"), ("JmsTemporaryTopic", "topic"))},
}
_BODIES: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    MESSAGE + "MessageImpl": lambda r: {},
    MESSAGE + "TextMessageImpl": _text,
    MESSAGE + "MapMessageImpl": _map,
    MESSAGE + "BytesMessageImpl": lambda r: {"base64": base64.b64encode(_raw(r)).decode("ascii")},
    MESSAGE + "ObjectMessageImpl": lambda r: {"base64": base64.b64encode(_raw(r)).decode("ascii")},
    # StreamMessageImpl's typed values are read by openjms_blob.stream_values, as the generic path does.
    MESSAGE + "StreamMessageImpl": lambda r: {"stream": _raw(r)},
}


def read(blob: bytes) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]] | None:
    """(java_class, headers, properties, body, internal) of a blob in OpenJMS's own layout, as
    the generic reader gives them (a StreamMessage body as {"stream": raw bytes}); None for
    anything else."""
    try:
        return _Reader(blob if type(blob) is bytes else bytes(blob)).message()
    except (Decline, IndexError, struct.error, ValueError, RecursionError):
        return None
