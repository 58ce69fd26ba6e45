"""From a canonical message to the row NServiceBus reads: routing, headers, table choice."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Literal, NamedTuple

import orjson

from bridge.config import TargetConfig
from bridge.errors import BadRow
from bridge.mapping import Mapping, render_template
from bridge.model import CanonicalMessage
from bridge.targets.base import Skipped
from bridge.targets.echo import ECHO_HEADER, echo_of
from bridge.targets.nservicebus import TargetTables
from bridge.timefmt import timespan, to_wire, utcnow

MESSAGE_MAX = 16384  # NServiceBus truncates ExceptionInfo.Message to this many characters


class Outgoing(NamedTuple):
    """One row for a transport table: `queue` names the queue (its .Delayed table for `delayed`)."""

    kind: Literal["queue", "delayed"]
    queue: str
    headers: dict[str, str]
    body: bytes | None
    expires: datetime | None = None
    due: datetime | None = None
    # The transport's own senders give each row a fresh Guid; qbridge gives it the message id
    # (unique per delivery, which the ledger makes single), sparing a random number per row.
    row_id: uuid.UUID | None = None


def envelope(
    msg: CanonicalMessage,
    mapping: Mapping,
    tables: TargetTables,
    target: TargetConfig,
    translated: frozenset[str] = frozenset(),
    database: str | None = None,
) -> Outgoing | Skipped:
    """Applies the mapping; raises BadRow when the message has nowhere to go. `database` is the
    target's identity, for the echo guard."""
    action = getattr(mapping.states, msg.state)
    if action == "skip":
        return Skipped(f"state {msg.state} -> skip")
    legacy_types = msg.enclosed_types or [n for n in (msg.destination, msg.source.queue) if n in mapping.types][:1]
    types = [mapping.map_type(t) for t in legacy_types]
    candidates = [*msg.enclosed_types, *types, msg.destination, msg.source.queue]
    routed = mapping.route(candidates)
    if routed is None:
        raise BadRow(
            f"no route for queue {msg.source.queue!r}, destination {msg.destination!r} or type "
            f"{msg.enclosed_types[0] if msg.enclosed_types else '(none)'!r}; add one to [routes] (or a '*' route)"
        )
    if (came_from := echo_of(msg.headers.get(ECHO_HEADER), "nservicebus", routed, database)) is not None:
        return Skipped(came_from)
    mid = str(msg.message_id)
    headers = _legacy_headers(msg, mapping, translated)
    headers.update(_derived(msg, types, mid))
    if msg.reply_to:
        # Only an exact route translates a reply queue; '*' says where unknown messages go,
        # not where their senders listen, so an unrouted reply queue keeps its own name.
        headers["NServiceBus.ReplyToAddress"] = tables.address(mapping.routes.get(msg.reply_to, msg.reply_to))
    headers.setdefault("NServiceBus.OriginatingEndpoint", msg.source.queue)
    headers.setdefault("NServiceBus.OriginatingMachine", msg.source.database)

    kind: Literal["queue", "delayed"] = "queue"
    queue, expires, due = routed, msg.expires, None
    if action == "delayed":
        if msg.due is None:
            raise BadRow(f"state {msg.state} maps to 'delayed' but the message has no due time")
        kind, due, expires = "delayed", msg.due, None  # the transport rejects TTBR on delayed messages
        headers["NServiceBus.DeliverAt"] = to_wire(msg.due)
    elif action == "error":
        queue = target.error_queue
        headers.update(_failure_headers(msg, tables, routed))
        expires = None
    elif action == "audit":
        queue = target.audit_queue
        headers["NServiceBus.ProcessingEndpoint"] = routed
        headers["NServiceBus.ProcessingMachine"] = msg.source.database
        expires = None
    if expires is not None:
        headers["NServiceBus.TimeToBeReceived"] = timespan(expires - msg.time_sent)

    headers.update(part_headers(msg))
    values = {
        "system": msg.source.system, "database": msg.source.database, "queue": msg.source.queue,
        "key": msg.source.key, "message_id": mid, "destination": routed,
        "state": msg.state, "type": types[0] if types else "",
    }
    for name, template in mapping.headers.set.items():
        headers[name] = render_template(template, values, headers)
    return Outgoing(kind=kind, queue=queue, headers=headers, body=msg.body, expires=expires, due=due, row_id=msg.message_id)


def part_headers(msg: CanonicalMessage) -> dict[str, str]:
    """Extra parts a consumer can read back: their names in order, each part's bytes in base64."""
    if not msg.parts:
        return {}
    out = {"QBridge.Parts": orjson.dumps([p.name for p in msg.parts]).decode()}
    for p in msg.parts:
        out[f"QBridge.Part.{p.name}"] = base64.b64encode(p.body).decode("ascii")
    return out


def _legacy_headers(msg: CanonicalMessage, mapping: Mapping, translated: frozenset[str]) -> dict[str, str]:
    headers = msg.headers
    # Messages of one queue mostly carry the same header names: one plan per name set.
    plans: dict[tuple[tuple[str, ...], frozenset[str]], list[tuple[str, str]]] = mapping.__dict__.setdefault("_header_plans", {})
    key = (tuple(headers), translated)
    plan = plans.get(key)
    if plan is None:
        plan = [(name, target) for name in headers if (target := mapping.header_target(name, translated)) is not None]
        if len(plans) < 1000:
            plans[key] = plan
    return {target: headers[name] for name, target in plan}


def _derived(msg: CanonicalMessage, types: list[str], mid: str) -> dict[str, str]:
    h = {
        "NServiceBus.MessageId": mid,
        "NServiceBus.MessageIntent": msg.intent,
        "NServiceBus.TimeSent": to_wire(msg.time_sent),
        "NServiceBus.CorrelationId": msg.correlation_id or mid,
        "NServiceBus.ConversationId": msg.conversation_id or mid,
        ECHO_HEADER: f"{msg.source.system}://{msg.source.database}/{msg.source.queue}/{msg.source.key}",
    }
    if types:
        h["NServiceBus.EnclosedMessageTypes"] = ";".join(dict.fromkeys(types))
    if msg.content_type:
        h["NServiceBus.ContentType"] = msg.content_type
    if msg.priority is not None:
        h["QBridge.Priority"] = str(msg.priority)
    return h


def _failure_headers(msg: CanonicalMessage, tables: TargetTables, routed: str) -> dict[str, str]:
    f = msg.failure
    h = {
        "NServiceBus.FailedQ": tables.address(routed),
        "NServiceBus.ProcessingEndpoint": routed,
        "NServiceBus.ProcessingMachine": msg.source.database,
    }
    if f is None:
        h["NServiceBus.ExceptionInfo.ExceptionType"] = "QBridge.LegacyMessageNotDeliverable"
        h["NServiceBus.ExceptionInfo.Message"] = f"the legacy message was {msg.state} when qbridge read it"
        h["NServiceBus.ExceptionInfo.StackTrace"] = ""
        h["NServiceBus.TimeOfFailure"] = to_wire(utcnow())
        return h
    h["NServiceBus.ExceptionInfo.ExceptionType"] = f.exception_type
    h["NServiceBus.ExceptionInfo.Message"] = f.message[:MESSAGE_MAX]
    h["NServiceBus.ExceptionInfo.StackTrace"] = f.stack_trace
    h["NServiceBus.ExceptionInfo.Source"] = f"{msg.source.system}:{f.failed_queue}"
    h["NServiceBus.TimeOfFailure"] = to_wire(f.time_of_failure)
    if f.inner_exception_type:
        h["NServiceBus.ExceptionInfo.InnerExceptionType"] = f.inner_exception_type
    return h
