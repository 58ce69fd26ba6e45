"""OpenJMS `messages.messageBlob` written: the inverse of `openjms_blob.decode`.

The layouts are those `openjms_blob` reads (shared/fixtures/openjms/README.md): one writeExternal
payload per message, header and leaf object, with the class descriptors and serialVersionUIDs
OpenJMS 0.7.6.1/0.7.7 write. Maps are java.util.HashMaps, iterated as the JDK does, so a message
decoded from a real blob encodes to the same bytes.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from functools import partial
from typing import Any

from bridge.codecs.javaser_write import SC_SERIALIZABLE, SC_WRITE_METHOD, Desc, Writer, externalizable, mutf8
from bridge.codecs.openjms_blob import PKG, JmsMessage

CLIENT = "org.exolab.jms.client."
MESSAGE_IMPL = externalizable(PKG + "MessageImpl", 1)
MESSAGES = {  # class -> (descriptor, version its subclass part starts with)
    PKG + "MessageImpl": (MESSAGE_IMPL, None),
    PKG + "TextMessageImpl": (externalizable(PKG + "TextMessageImpl", 1, MESSAGE_IMPL), 1),
    PKG + "BytesMessageImpl": (externalizable(PKG + "BytesMessageImpl", 1, MESSAGE_IMPL), 1),
    PKG + "MapMessageImpl": (externalizable(PKG + "MapMessageImpl", 2, MESSAGE_IMPL), 2),
    PKG + "StreamMessageImpl": (externalizable(PKG + "StreamMessageImpl", 2, MESSAGE_IMPL), 2),
    PKG + "ObjectMessageImpl": (externalizable(PKG + "ObjectMessageImpl", 1, MESSAGE_IMPL), 1),
}
HEADER = externalizable(PKG + "MessageHeader", 1)
PROPERTIES = externalizable(PKG + "MessageProperties", 1)
TIMESTAMP = externalizable(PKG + "Timestamp", 1, Desc("java.util.Date", 7523967970034938905, SC_SERIALIZABLE | SC_WRITE_METHOD))
CORRELATION = externalizable(PKG + "CorrelationId", 1)
PRIORITY = externalizable(PKG + "Priority", 1)
TYPE = externalizable(PKG + "Type", 1)
DELIVERY_MODE = externalizable(PKG + "DeliveryModeImpl", 1)
MESSAGE_ID = externalizable(PKG + "MessageId", 2)
JMS_DESTINATION = externalizable(CLIENT + "JmsDestination", 1, externalizable(PKG + "DestinationImpl", 1))
QUEUE = externalizable(CLIENT + "JmsQueue", 1, JMS_DESTINATION)
TOPIC = externalizable(CLIENT + "JmsTopic", 1, JMS_DESTINATION)


def encode(msg: JmsMessage) -> bytes:
    """The messageBlob OpenJMS stores for `msg` (what `openjms_blob.decode` reads back)."""
    w = Writer()
    desc, version = MESSAGES[msg.java_class]
    internal = msg.internal

    def payload() -> None:
        w.pack("q??qq", 1, internal.get("readOnly", True), internal.get("processed", False),
               internal.get("acceptedTime", 0), internal.get("sequenceNumber", 0))
        _header(w, msg.headers, internal)

        def properties() -> None:
            w.pack("q", 1)
            _map(w, msg.properties)

        w.external(PROPERTIES, properties)
        _body(w, msg, version)

    return w.top(lambda: w.external(desc, payload))


def _header(w: Writer, h: dict[str, Any], internal: dict[str, Any]) -> None:
    def payload() -> None:
        w.pack("q", 1)
        _destination(w, h.get("JMSReplyTo"))
        _leaf(w, TIMESTAMP, "q", h.get("JMSTimestamp"))
        _correlation(w, h.get("JMSCorrelationID"))
        w.pack("?q", bool(h.get("JMSRedelivered")), h.get("JMSExpiration") or 0)
        _leaf(w, PRIORITY, "i", h.get("JMSPriority"))
        if h.get("JMSType") is None:
            w.null()
        else:
            w.external(TYPE, partial(_versioned, w, 1, w.chars, h["JMSType"]))
        _destination(w, h.get("JMSDestination"))
        _leaf(w, DELIVERY_MODE, "i", h.get("JMSDeliveryMode"))
        if h.get("JMSMessageID") is None:
            w.null()
        else:
            w.external(MESSAGE_ID, partial(_versioned, w, 2, w.utf, h["JMSMessageID"]))
        w.string(internal.get("wildcard"))
        w.string(internal.get("consumerIdString"))
        w.pack("q", internal.get("consumerId", 0))

    w.external(HEADER, payload)


def _versioned(w: Writer, version: int, write: Callable[[str], None], text: str) -> None:
    """A leaf object's payload: its version, then its one string."""
    w.pack("q", version)
    write(text)


def _leaf(w: Writer, desc: Desc, code: str, value: int | None) -> None:
    if value is None:
        w.null()
    else:
        w.external(desc, lambda: w.pack("q" + code, 1, value))


def _correlation(w: Writer, value: str | None) -> None:
    if value is None:
        return w.null()

    def payload() -> None:
        w.pack("q", 1)
        if value.startswith("ID:"):  # PROVIDER_USE: a message id, embedded
            w.pack("iq", 2, 2)
            w.utf(value)
        else:  # APPLICATION_USE
            w.pack("i", 1)
            w.chars(value)

    w.external(CORRELATION, payload)


def _destination(w: Writer, d: dict[str, Any] | None) -> None:
    if d is None:
        return w.null()
    base = TOPIC if d["kind"] == "topic" else QUEUE
    connection = d.get("connectionId")

    def plain() -> None:
        w.pack("qq?q", 1, 1, bool(d.get("persistent")), 1)
        w.chars(d["name"])

    if not d.get("temporary"):
        identity = ("dest", base.name, d["name"], bool(d.get("persistent")))
        return w.external(base, plain, identity)
    name = CLIENT + ("JmsTemporaryTopic" if d["kind"] == "topic" else "JmsTemporaryQueue")
    new = isinstance(connection, int)  # 0.7.7 writes a long connection id, 0.7.6.1 a String
    desc = externalizable(name, 2 if new else 1, base)

    def temporary() -> None:
        if new:
            w.pack("qq", 2, connection)
        else:
            w.pack("q", 1)
            w.string(connection)
        plain()

    w.external(desc, temporary, ("dest", name, d["name"], repr(connection)))


def _typed(w: Writer, value: dict[str, Any]) -> None:
    kind = value["type"]
    if kind == "java.lang.String":
        w.string(value["value"])
    elif kind == "byte[]":
        w.byte_array(base64.b64decode(value["base64"]))
    elif value.get("value") is None:
        w.null()
    else:
        w.boxed(kind, value["value"])


def _map(w: Writer, values: dict[str, dict[str, Any]]) -> None:
    w.hashmap({k: partial(_typed, w, v) for k, v in values.items()})


def _body(w: Writer, msg: JmsMessage, version: int | None) -> None:
    if version is None:
        return
    w.pack("q", version)
    body = msg.body
    if "text" in body or msg.java_class.endswith("TextMessageImpl"):
        w.string(body.get("text"))
    elif "map" in body:
        _map(w, body["map"])
    else:
        data = stream_bytes(body["values"]) if "values" in body else base64.b64decode(body.get("base64", ""))
        w.pack("i", len(data))
        w.raw(data)


_STREAM_TAGS = {"java.lang.Byte": (2, ">b"), "java.lang.Short": (4, ">h"), "java.lang.Integer": (6, ">i"),
                "java.lang.Long": (7, ">q"), "java.lang.Float": (8, ">f"), "java.lang.Double": (9, ">d")}


def stream_bytes(values: list[dict[str, Any]]) -> bytes:
    """StreamMessageImpl's typed encoding (the inverse of `openjms_blob.stream_values`)."""
    out = bytearray()
    for v in values:
        kind = v["type"]
        if kind is None:
            out.append(0)
        elif kind == "java.lang.Boolean":
            out.append(1 | (0x10 if v["value"] else 0))
        elif kind == "byte[]":
            data = base64.b64decode(v["base64"])
            out += bytes((3,)) + struct.pack(">i", len(data)) + data
        elif kind == "java.lang.Character":
            out += bytes((5,)) + v["value"].encode("utf-16-be")
        elif kind == "java.lang.String":
            data = mutf8(v["value"])
            out += bytes((10,)) + struct.pack(">H", len(data)) + data
        else:
            tag, fmt = _STREAM_TAGS[kind]
            out += bytes((tag,)) + struct.pack(fmt, v["value"])
    return bytes(out)

def typed_value(kind: str, text: str) -> dict[str, Any]:
    """A property's text (as the OpenJMS source wrote it) as its Java type again."""
    try:
        if kind in ("java.lang.Integer", "java.lang.Long", "java.lang.Short", "java.lang.Byte"):
            return {"type": kind, "value": int(text)}
        if kind in ("java.lang.Double", "java.lang.Float"):
            return {"type": kind, "value": float(text)}
        if kind == "java.lang.Boolean":
            return {"type": kind, "value": text == "true"}
        if kind == "java.lang.Character" and len(text) == 1:
            return {"type": kind, "value": text}
        if kind == "byte[]":
            return {"type": kind, "base64": text}
    except ValueError:
        pass
    return {"type": "java.lang.String", "value": text}
