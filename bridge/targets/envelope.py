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
    types, routed = _routing(msg, mapping)
    if routed is None:
        raise BadRow(
            f"no route for queue {msg.source.queue!r}, destination {msg.destination!r} or type "
            f"{msg.enclosed_types[0] if msg.enclosed_types else '(none)'!r}; add one to [routes] (or a '*' route)"
        )
    if (came_from := echo_of(msg.headers.get(ECHO_HEADER), "nservicebus", routed, database)) is not None:
        return Skipped(came_from)
    mid = str(msg.message_id)
    headers = _legacy_headers(msg, mapping, translated)
    _add_derived(headers, msg, types, mid)
    if msg.reply_to:
        # Only an exact route translates a reply queue; '*' says where unknown messages go,
        # not where their senders listen, so an unrouted reply queue keeps its own name.
        headers["NServiceBus.ReplyToAddress"] = _reply_address(msg.reply_to, mapping, tables)
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

    if msg.parts:
        headers.update(part_headers(msg))
    if mapping.headers.set:
        values = {
            "system": msg.source.system, "database": msg.source.database, "queue": msg.source.queue,
            "key": msg.source.key, "message_id": mid, "destination": routed,
            "state": msg.state, "type": types[0] if types else "",
        }
        for name, template in mapping.headers.set.items():
            headers[name] = render_template(template, values, headers)
    return Outgoing(kind, queue, headers, msg.body, expires, due, msg.message_id)


def _routing(msg: CanonicalMessage, mapping: Mapping) -> tuple[list[str], str | None]:
    """(the NServiceBus types, the routed queue) of a message; the same for every message of a
    queue with the same legacy types and destination, so worked out once per such combination."""
    memo: dict[tuple[tuple[str, ...], str, str], tuple[list[str], str | None]] = mapping.__dict__.setdefault("_routing", {})
    key = (tuple(msg.enclosed_types), msg.destination, msg.source.queue)
    found = memo.get(key)
    if found is None:
        legacy_types = msg.enclosed_types or [n for n in (msg.destination, msg.source.queue) if n in mapping.types][:1]
        types = [mapping.map_type(t) for t in legacy_types]
        found = types, mapping.route([*msg.enclosed_types, *types, msg.destination, msg.source.queue])
        if len(memo) < 10_000:
            memo[key] = found
    return list(found[0]), found[1]


def _reply_address(reply_to: str, mapping: Mapping, tables: TargetTables) -> str:
    memo: dict[tuple[str, str, str, str | None], str] = mapping.__dict__.setdefault("_reply_addresses", {})
    key = (reply_to, tables.flavor, tables.schema, tables.catalog)
    address = memo.get(key)
    if address is None:
        address = tables.address(mapping.routes.get(reply_to, reply_to))
        if len(memo) < 10_000:
            memo[key] = address
    return address


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


def _add_derived(h: dict[str, str], msg: CanonicalMessage, types: list[str], mid: str) -> None:
    """The headers qbridge derives from the message, set over the legacy ones."""
    src = msg.source
    h["NServiceBus.MessageId"] = mid
    h["NServiceBus.MessageIntent"] = msg.intent
    h["NServiceBus.TimeSent"] = to_wire(msg.time_sent)
    h["NServiceBus.CorrelationId"] = msg.correlation_id or mid
    h["NServiceBus.ConversationId"] = msg.conversation_id or mid
    h[ECHO_HEADER] = f"{src.system}://{src.database}/{src.queue}/{src.key}"
    if types:
        h["NServiceBus.EnclosedMessageTypes"] = types[0] if len(types) == 1 else ";".join(dict.fromkeys(types))
    if msg.content_type:
        h["NServiceBus.ContentType"] = msg.content_type
    if msg.priority is not None:
        h["QBridge.Priority"] = str(msg.priority)


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
