"""An OpenJMS message a move-mode rollback gives back: rebuilt from the row the job delivered.

Move mode deleted the handle, and the message once no handle held it, as OpenJMS's own consumer
does; so the message is rebuilt from what the job wrote: the JMS headers it carried as
`<prefix>*` headers (under their renamed names where the mapping renames them), its properties
with their Java types (`<prefix>PropertyTypes`), its body of the kind it had (`<prefix>BodyKind`,
`<prefix>BodyTypes`), the time sent and expiry, and the JMSMessageID the store knew it by, so a
consumer that de-duplicates by JMSMessageID sees the same message. The blob is written with
`openjms_encode`; the handle gets the message's own time as its accepted time (so it comes
back in about the place of the queue it had) and the store's next sequence number.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import orjson
import sqlalchemy as sa

from bridge.codecs.openjms_blob import PKG, JmsMessage
from bridge.codecs.openjms_encode import encode, typed_value
from bridge.sources.base import SourceRow, delivered_headers
from bridge.timefmt import UTC

BODY_KINDS = ("Message", "TextMessage", "BytesMessage", "MapMessage", "StreamMessage", "ObjectMessage")
DELIVERY_MODES = {"NON_PERSISTENT": 1, "PERSISTENT": 2}
STATEMENT_KEYS = 500
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def rebuild(source: Any, key: str, delivered: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """("owed", what `give_back` re-inserts) or ("unsure", None or {"why": ...}) when the
    delivered headers do not say what kind of body the message had, or lack a property it had."""
    mid, _, cid = key.rpartition("#")
    h = delivered["headers"]
    jms = delivered_headers(h, source.mapping, source.prefix)
    kind = jms.get("BodyKind")
    if kind not in BODY_KINDS:
        return "unsure", None
    if "PropertyTypes" not in jms and any(name.startswith("Property.") for name in jms):
        return "unsure", None  # the mapping dropped the properties' Java types
    try:
        body = _body(kind, delivered["body"], jms.get("BodyTypes"), jms.get("BodyNull") == "true")
        kinds = orjson.loads(jms.get("PropertyTypes") or "{}")
        priority = int(jms.get("Priority") or 4)
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError, UnicodeDecodeError):
        return "unsure", None
    dropped = sorted(f"{source.prefix}Property.{name}" for name in kinds if f"Property.{name}" not in jms)
    if dropped:
        return "unsure", {"why": f"the mapping dropped {', '.join(dropped)} (named in {source.prefix}PropertyTypes): "
                                 "given back, the message would lack them"}
    topic = "Subscription" in jms  # the source names the durable subscriber of a topic's handle
    try:
        timestamp = _exact(jms, "Timestamp", delivered.get("sent"))
        expires = _exact(jms, "Expiration", delivered.get("expires")) or 0
    except ValueError:
        return "unsure", None
    reply = _reply(jms, delivered.get("reply_to"))
    correlation = h.get("NServiceBus.CorrelationId")
    headers = {
        "JMSMessageID": jms.get("MessageID") or mid,
        "JMSCorrelationID": correlation if correlation and correlation != h.get("NServiceBus.MessageId") else None,
        "JMSReplyTo": reply,
        "JMSDestination": {"name": jms.get("Destination") or source.queue, "kind": "topic" if topic else "queue",
                           "temporary": False, "persistent": True},
        "JMSType": jms.get("Type"),
        "JMSDeliveryMode": DELIVERY_MODES.get(jms.get("DeliveryMode", ""), 2),
        "JMSPriority": priority,
        "JMSTimestamp": timestamp,
        "JMSExpiration": expires,
        "JMSRedelivered": False,  # OpenJMS sets it from the handle's `delivered` when it delivers
    }
    carried = "Property."
    properties = {name[len(carried):]: _property(kinds, name[len(carried):], text)
                  for name, text in jms.items() if name.startswith(carried)}
    sent = timestamp or _ms(delivered.get("sent"))
    message = JmsMessage(PKG + kind + "Impl", kind, headers, properties, body,
                         {"readOnly": True, "processed": False, "acceptedTime": sent, "sequenceNumber": 0,
                          "wildcard": None, "consumerId": 0, "consumerIdString": None})
    return "owed", {"message_id": mid, "consumer_id": int(cid), "consumer": jms.get("Subscription") or source.queue,
                    "topic": topic, "priority": priority, "accepted": sent, "expiry": expires,
                    "delivered": 1 if jms.get("Redelivered") == "true" else 0, "jms": message.to_json()}


def _ms(value: Any) -> int:
    """Milliseconds since 1970 of an aware time, exactly (no float on the way)."""
    return 0 if value is None else (value - EPOCH) // timedelta(milliseconds=1)


def _exact(jms: dict[str, str], name: str, fallback: Any) -> int | None:
    """A JMS time the source carried as its own header (where the NServiceBus row has none, or
    not exactly), else the NServiceBus time it became (deliveries by an earlier qbridge)."""
    if name in jms:
        return int(jms[name]) if jms[name] != "" else None
    return _ms(fallback)


def _reply(jms: dict[str, str], routed_back: str | None) -> dict[str, Any] | None:
    if "ReplyToDestination" in jms:
        kind, _, name = jms["ReplyToDestination"].partition(":")
        temporary = "ReplyTo" in jms
        return {"name": name, "kind": kind, "temporary": temporary, "persistent": not temporary}
    if jms.get("ReplyTo"):  # delivered by an earlier qbridge: a temporary queue, by name
        return {"name": jms["ReplyTo"], "kind": "queue", "temporary": True, "persistent": False}
    if routed_back:
        return {"name": routed_back, "kind": "queue", "temporary": False, "persistent": True}
    return None


def _property(kinds: dict[str, Any], name: str, text: str) -> dict[str, Any]:
    if name in kinds and kinds[name] is None:
        return {"type": None, "value": None}  # set to null
    return typed_value(kinds.get(name, "java.lang.String"), text)


def _body(kind: str, data: bytes, types: str | None, null: bool = False) -> dict[str, Any]:
    if kind == "TextMessage":
        return {"text": None if null else data.decode("utf-8", "surrogatepass")}
    if kind in ("BytesMessage", "ObjectMessage"):
        return {"base64": base64.b64encode(data).decode("ascii")}
    if kind == "MapMessage":
        values, kinds = orjson.loads(data), orjson.loads(types or "{}")
        return {"map": {k: _typed(kinds[k], v) for k, v in values.items()}}
    if kind == "StreamMessage":
        values, kinds = orjson.loads(data), orjson.loads(types or "[]")
        if len(values) != len(kinds):
            raise ValueError("BodyTypes does not match the body")
        return {"values": [_typed(t, v) for t, v in zip(kinds, values)]}
    return {}


def _typed(kind: str | None, value: Any) -> dict[str, Any]:
    if kind == "byte[]":
        return {"type": kind, "base64": value}
    return {"type": kind, "value": value}


def message_of(payload: dict[str, Any], sequence: int, queue: bool) -> tuple[JmsMessage, bytes]:
    """The message and its blob; `queue`: the kind of the store's destination, which the
    delivered row names only for topics."""
    jms = JmsMessage(**payload["jms"])
    jms.internal["sequenceNumber"] = sequence
    jms.headers["JMSDestination"]["kind"] = "queue" if queue else "topic"
    return jms, encode(jms)


def give_back(source: Any, conn: sa.Connection, owed: Sequence[Any]) -> tuple[list[str], int]:
    """Re-inserts each owed handle, and its message where no other handle still holds it; an
    owed handle whose destination or durable subscriber is gone comes back as gone."""
    if not owed:
        return [], 0
    dest = source._destination(conn)
    if dest is None:
        return [o.key for o in owed], 0
    h, m, c = source.t["message_handles"], source.t["messages"], source.t["consumers"]
    consumers = set(conn.execute(sa.select(c.c.consumerid).where(c.c.destinationid == dest[0])).scalars())
    mids = sorted({o.payload["message_id"] for o in owed})
    # Locked: a consume of another handle of the message either deleted it before this looks, or
    # sees the handle given back.
    stored = source.lock_messages(conn, mids)
    held: set[tuple[str, int]] = set()
    for start in range(0, len(mids), STATEMENT_KEYS):
        chunk = mids[start:start + STATEMENT_KEYS]
        held.update((mid, int(cid)) for mid, cid in conn.execute(sa.select(h.c.messageid, h.c.consumerid).where(
            h.c.destinationid == dest[0], h.c.consumerid.in_(sorted(consumers) or [-1]), h.c.messageid.in_(chunk))))
    sequence = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(h.c.sequencenumber), 0))).scalar_one())
    gone, messages, handles = [], [], []
    for o in owed:
        p = o.payload
        if p["consumer_id"] not in consumers:
            gone.append(o.key)
            continue
        if (p["message_id"], p["consumer_id"]) in held:
            continue  # the handle is there: nothing to give back
        sequence += 1
        if p["message_id"] not in stored:
            stored.add(p["message_id"])
            messages.append({"messageid": p["message_id"], "destinationid": dest[0], "priority": p["priority"],
                             "createtime": p["accepted"], "expirytime": p["expiry"], "processed": 0,
                             "messageblob": message_of(p, sequence, dest[1])[1]})
        handles.append({"messageid": p["message_id"], "destinationid": dest[0], "consumerid": p["consumer_id"],
                        "priority": p["priority"], "acceptedtime": p["accepted"], "sequencenumber": sequence,
                        "expirytime": p["expiry"], "delivered": p["delivered"]})
    if messages:
        conn.execute(sa.insert(m), messages)
    if handles:
        conn.execute(sa.insert(h), handles)
    return gone, len(handles)


def given_back_raw(source: Any, owed: Any) -> dict[str, Any]:
    """The handle as `fetch_keys` reads it, rebuilt, for a quarantined message whose destination
    or subscriber is gone (`quarantine replay` decodes it like any other)."""
    p = owed.payload
    _, blob = message_of(p, 0, not p["topic"])
    values = {"messageid": p["message_id"], "consumerid": p["consumer_id"], "delivered": p["delivered"],
              "acceptedtime": p["accepted"], "sequencenumber": 0, "consumer": p["consumer"],
              "message_row": p["message_id"], "messageblob": blob, "expirytime": p["expiry"],
              "createtime": p["accepted"], "isqueue": 0 if p["topic"] else 1}
    return source.raw(SourceRow(key=owed.key, consumable=True, values=values))
