"""OpenJMS 0.7.6+ as a target: `messages` and `message_handles` rows its server loads.

Facts: reference/legacy-sources.md §2 and OpenJMS 0.7.7's MessageMgr/QueueDestinationCache.
One `messages` row (the blob `openjms_encode` writes, the class OpenJMS's readExternal reads) and
one handle per consumer: the queue's own consumer row (named like the queue) or every durable
subscriber of a topic. The server stamps `acceptedTime` = now and `sequenceNumber` = a counter
of its own that restarts with it (a tie-break between equal times), and OpenJMS clients make
JMSMessageID "ID:" + a UUID; qbridge does the same, with the NServiceBus message id as the UUID.
OpenJMS has no scheduled delivery: a delayed NServiceBus message is left in `.Delayed` until due.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import orjson
import sqlalchemy as sa

from bridge.codecs.echo import ECHO_HEADER, source_tag
from bridge.codecs.openjms_blob import PKG, JmsMessage
from bridge.codecs.openjms_encode import encode, typed_value
from bridge.config import JobConfig
from bridge.errors import BadRow, TargetSchemaError
from bridge.identifiers import url_identity
from bridge.mapping import Mapping
from bridge.model import CanonicalMessage
from bridge.schemas.openjms import is_queue, tables
from bridge.sources.base import Subscription
from bridge.targets.base import Skipped, Target
from bridge.targets.bulk import insert_rows
from bridge.targets.reverse import ReverseRules, type_forms
from bridge.timefmt import utcnow

PERSISTENT = 2
DEFAULT_PRIORITY = 4
MESSAGE_ID_MAX = 64  # messages.messageId varchar(64)
TEXT_TYPES = ("json", "xml", "text/")


class JmsRows(NamedTuple):
    destination: str
    message: dict[str, Any]
    handles: list[dict[str, Any]]


def _epoch_ms(value: Any) -> int:
    return int(value.timestamp() * 1000)


class OpenJMSTarget(Target):
    system: ClassVar[str] = "openjms"
    schedules: ClassVar[bool] = False

    def __init__(self, job: JobConfig, url: str, mapping: Mapping) -> None:
        super().__init__(job, url, mapping)
        self.t = tables(self.state_schema)
        self.identity = job.target.database or url_identity(url)
        self.rules = ReverseRules(mapping)
        self.prefix = mapping.jms.header_prefix
        self.destinations: dict[str, tuple[int, bool]] = {}
        self.consumers: dict[int, list[tuple[str, int]]] = {}
        self.sequence: int | None = None  # read from the store by the first batch

    @property
    def state_schema(self) -> str | None:
        return None if self.backend == "sqlite" else self.job.target.schema_

    def begin_batch(self, conn: sa.Connection) -> None:
        """Destinations and consumers as the store has them now (durable subscribers come and
        go); the store's check and its highest sequence number only once per process."""
        d, c, h = self.t["destinations"], self.t["consumers"], self.t["message_handles"]
        if self.sequence is None:
            insp = sa.inspect(conn)
            missing = [n for n in ("destinations", "messages", "message_handles", "consumers")
                       if not insp.has_table(n, schema=self.state_schema)]
            if missing:
                raise TargetSchemaError(f"the OpenJMS target has no {', '.join(missing)} table(s): not an OpenJMS 0.7.6+ "
                                        "store (create it with OpenJMS's dbtool)")
            # The server's own counter restarts with it and only breaks ties between equal accept
            # times, so one read of the store's highest, then counting on, is all it needs.
            self.sequence = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(h.c.sequencenumber), 0))).scalar_one())
        destinations = {name: (int(did), is_queue(q)) for name, q, did in
                        conn.execute(sa.select(d.c.name, d.c.isqueue, d.c.destinationid))}
        consumers: dict[int, list[tuple[str, int]]] = {}
        for name, did, cid in conn.execute(sa.select(c.c.name, c.c.destinationid, c.c.consumerid).order_by(c.c.consumerid)):
            consumers.setdefault(int(did), []).append((name, int(cid)))
        # Each assigned whole: whoever maps a message meanwhile sees the last read or this one, never half of one.
        self.destinations, self.consumers = destinations, consumers

    def envelope(self, msg: CanonicalMessage, translated: frozenset[str]) -> JmsRows | Skipped:
        name = self.rules.destination(msg, self.system, self.identity)
        if isinstance(name, Skipped):
            return name
        found = self.destinations.get(name)
        if found is None:
            raise BadRow(f"OpenJMS destination {name!r} does not exist in the store; create it with OpenJMS's "
                         "administration (or route the message elsewhere)")
        did, queue = found
        consumers = [(n, cid) for n, cid in self.consumers.get(did, []) if not queue or n == name]
        if not consumers:
            if queue:
                raise BadRow(f"OpenJMS queue {name!r} has no consumer row named like it (OpenJMS creates one with every "
                             "queue): not a queue OpenJMS made")
            return Skipped(f"OpenJMS topic {name!r} has no durable subscriber; OpenJMS keeps no message for it")
        mid = msg.source.key
        jms_id = f"ID:{mid}" if len(mid) + 3 <= MESSAGE_ID_MAX and mid.isascii() else f"ID:{msg.message_id}"
        accepted = _epoch_ms(utcnow())
        assert self.sequence is not None  # begin_batch ran
        self.sequence += 1
        jms = self._jms(msg, name, queue, jms_id, accepted)
        expiry = jms.headers["JMSExpiration"]
        message = {"messageid": jms_id, "destinationid": did, "priority": DEFAULT_PRIORITY, "createtime": accepted,
                   "expirytime": expiry, "processed": 0, "messageblob": encode(jms)}
        handles = [{"messageid": jms_id, "destinationid": did, "consumerid": cid, "priority": DEFAULT_PRIORITY,
                    "acceptedtime": accepted, "sequencenumber": self.sequence, "expirytime": expiry, "delivered": 0}
                   for _, cid in consumers]
        return JmsRows(name, message, handles)

    def _jms(self, msg: CanonicalMessage, name: str, queue: bool, jms_id: str, accepted: int) -> JmsMessage:
        kind, body = self._body(msg)
        jms_type = self.rules.known_type(msg) or (type_forms(msg.enclosed_types[0])[-1] if msg.enclosed_types else kind)
        reply = None
        if msg.reply_to:
            reply_name = self.mapping.routes.get(msg.reply_to, msg.reply_to)
            reply = {"name": reply_name, "kind": "queue", "temporary": False, "persistent": reply_name in self.destinations}
        headers = {
            "JMSMessageID": jms_id, "JMSCorrelationID": msg.correlation_id, "JMSReplyTo": reply,
            "JMSDestination": {"name": name, "kind": "queue" if queue else "topic", "temporary": False, "persistent": True},
            "JMSType": jms_type, "JMSDeliveryMode": PERSISTENT, "JMSPriority": DEFAULT_PRIORITY,
            "JMSTimestamp": _epoch_ms(msg.time_sent), "JMSExpiration": _epoch_ms(msg.expires) if msg.expires else 0,
            "JMSRedelivered": False,
        }
        internal = {"readOnly": True, "processed": False, "acceptedTime": accepted, "sequenceNumber": self.sequence,
                    "wildcard": None, "consumerId": 0, "consumerIdString": None}
        return JmsMessage(PKG + kind + "Impl", kind, headers, self._properties(msg), body, internal)

    def _body(self, msg: CanonicalMessage) -> tuple[str, dict[str, Any]]:
        """A TextMessage for text content (JSON, XML, text/*) that is UTF-8, else a BytesMessage."""
        data = msg.body or b""
        content = (msg.content_type or "application/json").lower()
        if any(t in content for t in TEXT_TYPES):
            try:
                return "TextMessage", {"text": data.decode("utf-8")}
            except UnicodeDecodeError:
                pass
        return "BytesMessage", {"base64": base64.b64encode(data).decode("ascii")}

    def _properties(self, msg: CanonicalMessage) -> dict[str, dict[str, Any]]:
        """Headers as String properties; a property a forward job carried over as
        `<prefix>Property.NAME` gets its name and (from `<prefix>PropertyTypes`) its Java type back."""
        headers = self.rules.headers(msg, self.rules.template_values(msg, "", ""))
        kinds = orjson.loads(headers.pop(f"{self.prefix}PropertyTypes", "{}") or "{}")
        props: dict[str, dict[str, Any]] = {}
        carried = f"{self.prefix}Property."
        for header, text in headers.items():
            if header.startswith(carried):
                name = header[len(carried):]
                props[name] = typed_value(kinds.get(name, "java.lang.String"), text)
            elif not header.startswith(self.prefix):  # other JMS.* headers describe the original message
                props[header] = {"type": "java.lang.String", "value": text}
        props[ECHO_HEADER] = {"type": "java.lang.String",
                              "value": source_tag(msg.source.system, msg.source.database, msg.source.queue, msg.source.key)}
        return props

    def ledger_target(self, out: JmsRows) -> str:
        return out.destination

    def write(self, conn: sa.Connection, outs: Sequence[JmsRows]) -> None:
        insert_rows(conn, self.t["messages"], [o.message for o in outs])
        insert_rows(conn, self.t["message_handles"], [h for o in outs for h in o.handles])

    def subscriptions(self, conn: sa.Connection) -> list[Subscription]:
        """Topics with durable subscribers: a proxy queue routed to one subscribes to its type."""
        self.begin_batch(conn)
        return [Subscription(endpoint=name, topic=name) for name, (did, queue) in sorted(self.destinations.items())
                if not queue and self.consumers.get(did)]

    def tables(self) -> list[sa.Table]:
        return []  # the store is OpenJMS's own (dbtool); init adds qbridge's state tables beside it
