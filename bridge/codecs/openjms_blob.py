"""OpenJMS `messages.messageBlob`: its Externalizable message classes, read field by field.

Layouts: shared/fixtures/openjms/README.md and reference/legacy-sources.md §2.2 (OpenJMS
0.7.6.1 and 0.7.7-beta-1 write the same wire format; only JmsTemporaryQueue differs).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.codecs import openjms_fast
from bridge.codecs.compiled import compiled, tell_missing
from bridge.codecs.javaser import JavaArray, JavaObject, JavaStreamError, Payload, mutf8, read, utf16

Parts = tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]
# The compiled twin of openjms_fast (openjms_native.pyx) when it was built: the same answers, ~5x faster.
COMPILED: Callable[[bytes], Parts | None] | None = compiled("openjms_native", "read")
_read_parts: Callable[[bytes], Parts | None] = COMPILED or openjms_fast.read

PKG = "org.exolab.jms.message."
MESSAGE_TYPES = {
    PKG + "MessageImpl": "Message",
    PKG + "TextMessageImpl": "TextMessage",
    PKG + "BytesMessageImpl": "BytesMessage",
    PKG + "MapMessageImpl": "MapMessage",
    PKG + "StreamMessageImpl": "StreamMessage",
    PKG + "ObjectMessageImpl": "ObjectMessage",
}
DESTINATIONS = {
    "org.exolab.jms.client.JmsQueue": ("queue", False),
    "org.exolab.jms.client.JmsTopic": ("topic", False),
    "org.exolab.jms.client.JmsTemporaryQueue": ("queue", True),
    "org.exolab.jms.client.JmsTemporaryTopic": ("topic", True),
}
BOXED = {
    "java.lang.Boolean", "java.lang.Byte", "java.lang.Short", "java.lang.Character", "java.lang.Integer",
    "java.lang.Long", "java.lang.Float", "java.lang.Double",
}


class BlobError(ValueError):
    """A messageBlob that cannot be read: truncated, corrupt, or holding an unknown class."""


@dataclass
class JmsMessage:
    java_class: str
    message_type: str
    headers: dict[str, Any]
    properties: dict[str, dict[str, Any]]
    body: dict[str, Any]
    internal: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "java_class": self.java_class, "message_type": self.message_type, "headers": self.headers,
            "properties": self.properties, "body": self.body, "internal": self.internal,
        }


def decode(blob: bytes) -> JmsMessage:
    """Every JMS header, property and the body of one messageBlob; BlobError saying why not."""
    try:
        msg = decode_fast(blob)
    except Exception:  # noqa: BLE001 - the fast path only saves time: a fault in it must not cost the row
        msg = None
    return msg if msg is not None else decode_generic(blob)


def decode_fast(blob: bytes) -> JmsMessage | None:
    """What openjms_fast (or its compiled twin) reads of a blob in OpenJMS's own layout; None where it declines."""
    if COMPILED is None:
        tell_missing("openjms_native", "OpenJMS blobs")
    parts = _read_parts(blob)
    if parts is None:
        return None
    java_class, headers, properties, body, internal = parts
    if "stream" in body:
        try:
            body = {"values": stream_values(body["stream"])}
        except (ValueError, struct.error):  # BlobError and javaser's decode errors
            return None  # the generic reader words the error
    return JmsMessage(java_class, MESSAGE_TYPES[java_class], headers, properties, body, internal)


def decode_generic(blob: bytes) -> JmsMessage:
    """`decode` by the generic Java-serialization reader: any stream javaser follows."""
    try:
        top = read(blob)
        return _message(top)
    except BlobError:
        raise
    except JavaStreamError as e:
        raise BlobError(str(e)) from None
    except (struct.error, UnicodeDecodeError, RecursionError) as e:
        raise BlobError(f"corrupt messageBlob: {e}") from None
    except KeyError as e:  # a class whose fields are not OpenJMS's (a java.lang.Boolean without `value`)
        raise BlobError(f"corrupt messageBlob: no field {e} where OpenJMS writes one") from None
    except (TypeError, ValueError) as e:  # a field of another type than OpenJMS writes (a Character's chr())
        raise BlobError(f"corrupt messageBlob: {e}") from None


def _expect(obj: Any, *classes: str) -> JavaObject:
    if not isinstance(obj, JavaObject) or obj.class_name not in classes:
        got = obj.class_name if isinstance(obj, JavaObject) else type(obj).__name__
        raise BlobError(f"expected {' or '.join(classes)}, found {got}")
    return obj


def _message(top: Any) -> JmsMessage:
    if not isinstance(top, JavaObject) or top.class_name not in MESSAGE_TYPES:
        got = top.class_name if isinstance(top, JavaObject) else type(top).__name__
        raise BlobError(f"unknown class in messageBlob: {got} (expected an org.exolab.jms.message.*MessageImpl)")
    p = Payload(top)
    p.long()
    internal: dict[str, Any] = {"readOnly": p.bool(), "processed": p.bool(), "acceptedTime": p.long(), "sequenceNumber": p.long()}
    headers, more = _header(p.object())
    internal.update(more)
    properties = _properties(p.object())
    body = _body(top.class_name, p)
    return JmsMessage(top.class_name, MESSAGE_TYPES[top.class_name], headers, properties, body, internal)


def _header(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    p = Payload(_expect(obj, PKG + "MessageHeader"))
    p.long()
    reply_to = _destination(p.object())
    timestamp = _leaf_long(p.object(), PKG + "Timestamp")
    correlation = _correlation(p.object())
    redelivered = p.bool()
    expiration = p.long()
    priority = _leaf_int(p.object(), PKG + "Priority")
    jms_type = _type(p.object())
    destination = _destination(p.object())
    mode = _leaf_int(p.object(), PKG + "DeliveryModeImpl")
    message_id = _message_id(p.object())
    wildcard = p.object()
    unused = p.object()  # 0.7.7 `_unused`, 0.7.6.1 `_consumerId` (a String)
    last = p.long()  # 0.7.7 `_consumerId`, 0.7.6.1 `_clientid`
    headers = {
        "JMSMessageID": message_id, "JMSCorrelationID": correlation, "JMSReplyTo": reply_to,
        "JMSDestination": destination, "JMSType": jms_type, "JMSDeliveryMode": mode, "JMSPriority": priority,
        "JMSTimestamp": timestamp, "JMSExpiration": expiration, "JMSRedelivered": redelivered,
    }
    # The last two fields changed names between releases but not their wire format: report them raw.
    internal = {"wildcard": wildcard if isinstance(wildcard, str) else None,
                "consumerId": last, "consumerIdString": unused if isinstance(unused, str) else None}
    return headers, internal


def _leaf_long(obj: Any, cls: str) -> int | None:
    if obj is None:
        return None
    p = Payload(_expect(obj, cls))
    p.long()
    return p.long()


def _leaf_int(obj: Any, cls: str) -> int | None:
    if obj is None:
        return None
    p = Payload(_expect(obj, cls))
    p.long()
    return p.int()


def _type(obj: Any) -> str | None:
    if obj is None:
        return None
    p = Payload(_expect(obj, PKG + "Type"))
    p.long()
    return p.chars(p.int())


def _message_id(obj: Any) -> str | None:
    if obj is None:
        return None
    return _message_id_payload(Payload(_expect(obj, PKG + "MessageId")))


def _message_id_payload(p: Payload) -> str:
    version = p.long()
    if version == 1:  # pre-0.7.6 ids: a String without the "ID:" prefix
        value = p.object()
        if not isinstance(value, str):
            raise BlobError("MessageId v1 holds no string")
        return value if value.startswith("ID:") else "ID:" + value
    return p.utf()


def _correlation(obj: Any) -> str | None:
    if obj is None:
        return None
    p = Payload(_expect(obj, PKG + "CorrelationId"))
    p.long()
    usage = p.int()
    if usage == 1:  # APPLICATION_USE: the application's own string
        return p.chars(p.int())
    if usage == 2:  # PROVIDER_USE: a message id, embedded without an object header
        return _message_id_payload(p)
    raise BlobError(f"CorrelationId with unknown usage {usage}")


def _destination(obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    if not isinstance(obj, JavaObject) or obj.class_name not in DESTINATIONS:
        got = obj.class_name if isinstance(obj, JavaObject) else type(obj).__name__
        raise BlobError(f"unknown destination class {got}")
    kind, temporary = DESTINATIONS[obj.class_name]
    p = Payload(obj)
    out: dict[str, Any] = {"java_class": obj.class_name}
    connection: Any = None
    if temporary:
        version = p.long()
        connection = p.long() if version >= 2 else p.object()  # 0.7.7: long; 0.7.6.1: String
        p.long()  # JmsQueue / JmsTopic
    else:
        p.long()
    p.long()  # JmsDestination
    persistent = p.bool()
    p.long()  # DestinationImpl
    out.update(name=p.chars(p.int()), kind=kind, temporary=temporary, persistent=persistent)
    if temporary:
        out["connectionId"] = connection
    return out


def _properties(obj: Any) -> dict[str, dict[str, Any]]:
    if obj is None:
        return {}
    p = Payload(_expect(obj, PKG + "MessageProperties"))
    p.long()
    return {name: typed(v) for name, v in hashmap(p.object()).items()}  # the HashMap's own order


def hashmap(obj: Any) -> dict[str, Any]:
    """A java.util.HashMap (or Hashtable) as written by its writeObject: size, then key/value pairs."""
    if obj is None:
        return {}
    m = _expect(obj, "java.util.HashMap", "java.util.Hashtable", "java.util.LinkedHashMap")
    extras = m.annotations.get(m.class_name) or m.annotations.get("java.util.HashMap") or []
    if not extras or not isinstance(extras[0], bytes) or len(extras[0]) < 8:
        raise BlobError(f"{m.class_name} without its size block")
    size = struct.unpack(">i", extras[0][4:8])[0]
    values = [x for x in extras[1:]]
    if size < 0 or len(values) != 2 * size:
        raise BlobError(f"{m.class_name} says {size} entries but holds {len(values) // 2}")
    out: dict[str, Any] = {}
    for key, value in zip(values[0::2], values[1::2]):
        if not isinstance(key, str):
            raise BlobError("a map key is not a string")
        out[key] = value
    return out


def typed(value: Any) -> dict[str, Any]:
    """A Java value in the manifests' convention: {"type", "value"} or {"type": "byte[]", "base64"}."""
    if value is None:
        return {"type": None, "value": None}
    if isinstance(value, str):
        return {"type": "java.lang.String", "value": value}
    if isinstance(value, JavaArray) and value.classdesc.name == "[B":
        return {"type": "byte[]", "base64": base64.b64encode(value.items).decode("ascii")}
    if isinstance(value, JavaObject) and value.class_name in BOXED:
        v = value.field("value")
        if value.class_name == "java.lang.Character":
            v = chr(v)
        return {"type": value.class_name, "value": v}
    got = value.class_name if isinstance(value, JavaObject) else type(value).__name__
    raise BlobError(f"unsupported property value type {got}")


def _body(cls: str, p: Payload) -> dict[str, Any]:
    name = cls[len(PKG):]
    if name == "MessageImpl":
        return {}
    p.long()
    if name == "TextMessageImpl":
        text = p.object()
        if text is not None and not isinstance(text, str):
            raise BlobError("TextMessage body is not a string")
        return {"text": text}
    if name == "MapMessageImpl":
        return {"map": {k: typed(v) for k, v in hashmap(p.object()).items()}}
    data = p.bytes(p.int())
    if name == "StreamMessageImpl":
        return {"values": stream_values(data)}
    return {"base64": base64.b64encode(data).decode("ascii")}  # Bytes, Object (a nested stream)


_STREAM = {2: (">b", 1, "java.lang.Byte"), 4: (">h", 2, "java.lang.Short"), 6: (">i", 4, "java.lang.Integer"),
           7: (">q", 8, "java.lang.Long"), 8: (">f", 4, "java.lang.Float"), 9: (">d", 8, "java.lang.Double")}


def stream_values(data: bytes) -> list[dict[str, Any]]:
    """StreamMessageImpl's own typed encoding: a type byte (low nibble), then the value."""
    out: list[dict[str, Any]] = []
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise BlobError(f"StreamMessage body ends early at byte {pos}")
        chunk = data[pos:pos + n]
        pos += n
        return chunk

    while pos < len(data):
        tag = take(1)[0]
        kind = tag & 0x0F
        if kind == 0:
            out.append({"type": None, "value": None})
        elif kind == 1:
            out.append({"type": "java.lang.Boolean", "value": bool(tag >> 4)})
        elif kind == 3:
            n = struct.unpack(">i", take(4))[0]
            out.append({"type": "byte[]", "base64": base64.b64encode(take(n)).decode("ascii")})
        elif kind == 5:
            out.append({"type": "java.lang.Character", "value": utf16(take(2))})
        elif kind == 10:
            out.append({"type": "java.lang.String", "value": mutf8(take(struct.unpack(">H", take(2))[0]))})
        elif kind in _STREAM:
            fmt, n, java = _STREAM[kind]
            out.append({"type": java, "value": struct.unpack(fmt, take(n))[0]})
        else:
            raise BlobError(f"StreamMessage body has unknown type tag {tag:#04x} at byte {pos - 1}")
    return out
