"""From a canonical message to the row NServiceBus reads: routing, headers, table choice."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime
from typing import Literal, NamedTuple

import orjson

from bridge.codecs.echo import ECHO_HEADER, echo_of
from bridge.config import TargetConfig
from bridge.errors import BadRow
from bridge.mapping import Mapping, render_template
from bridge.mapping_rules import MessageFacts, compiled, matched
from bridge.model import MESSAGE_MAX, CanonicalMessage, Failure, FailureInfo, PlainMessage
from bridge.schemas.nservicebus import TargetTables
from bridge.targets.base import Skipped
from bridge.targets.reshape import Reshaped, reshape
from bridge.timefmt import timespan, to_wire, utcnow


class Outgoing(NamedTuple):
    """One row for a transport table: `queue` names the queue (its .Delayed table for `delayed`)."""

    kind: Literal["queue", "delayed"]
    queue: str
    headers: dict[str, str]
    body: bytes | None
    expires: datetime | None = None
    due: datetime | None = None


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
    src = msg.source
    types, routed = routing(msg.enclosed_types, msg.destination, src.queue, mapping)
    facts, decided = _decide(mapping, src.system, src.queue, msg.destination, msg.state, msg.enclosed_types, msg.headers, msg.body)
    if isinstance(decided, Skipped):
        return decided
    routed = decided or routed
    if routed is None:
        raise BadRow(
            f"no route for queue {msg.source.queue!r}, destination {msg.destination!r} or type "
            f"{msg.enclosed_types[0] if msg.enclosed_types else '(none)'!r}; add one to [routes] (or a '*' route)"
        )
    if (came_from := echo_of(msg.headers.get(ECHO_HEADER), "nservicebus", routed, database)) is not None:
        return Skipped(came_from)
    mid = str(msg.message_id)
    headers = _common_headers(msg.headers, mapping, tables, translated, mid, msg.intent, msg.time_sent, msg.correlation_id,
                              msg.conversation_id, src.system, src.database, src.queue, src.key, types, msg.content_type,
                              msg.priority, msg.reply_to)

    kind: Literal["queue", "delayed"] = "queue"
    queue, expires, due = routed, msg.expires, None
    if action == "delayed":
        if msg.due is None:
            raise BadRow(f"state {msg.state} maps to 'delayed' but the message has no due time")
        kind, due, expires = "delayed", msg.due, None  # the transport rejects TTBR on delayed messages
        headers["NServiceBus.DeliverAt"] = to_wire(msg.due)
    elif action == "error":
        queue = target.error_queue
        headers.update(_failure_headers(msg.failure, msg.state, src.system, src.database, tables, routed))
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
        _set_headers(headers, mapping, src.system, src.database, src.queue, src.key, mid, routed, msg.state, types)
    body = msg.body
    if facts is not None and mapping.reshapes:
        out = Reshaped(headers, body, expires)
        values = _values(src.system, src.database, src.queue, src.key, mid, routed, msg.state, types)
        if (skipped := reshape(mapping, facts, out, values, kind == "queue" and action == "queue", msg.state, queue)) is not None:
            return skipped
        headers, body, expires = out.headers, out.body, out.expires
    return Outgoing(kind, queue, headers, body, expires, due)


def plain_envelope(msg: PlainMessage, mapping: Mapping, tables: TargetTables, target: TargetConfig,
                   translated: frozenset[str] = frozenset()) -> Outgoing | Skipped | None:
    """`envelope` of a plain message, with the same helpers; None when its rules need the full
    message (a state not mapped to 'queue', 'delayed', 'error' or 'skip', 'error' without the
    legacy failure, no route, or an echo tag): the generic path then decides, quarantine reasons
    included."""
    action = getattr(mapping.states, msg.state)
    if action == "skip":
        return Skipped(f"state {msg.state} -> skip")
    if (action not in ("queue", "delayed", "error") or ECHO_HEADER in msg.headers
            or (action == "delayed" and msg.due is None) or (action == "error" and msg.failure is None)):
        return None
    types, routed = routing(msg.enclosed_types, msg.destination, msg.queue, mapping)
    facts, decided = _decide(mapping, msg.system, msg.queue, msg.destination, msg.state, msg.enclosed_types, msg.headers, msg.body)
    if isinstance(decided, Skipped):
        return decided
    routed = decided or routed
    if routed is None:
        return None
    mid = msg.message_id
    headers = _common_headers(msg.headers, mapping, tables, translated, mid, "Send", msg.time_sent, msg.correlation_id,
                              msg.conversation_id, msg.system, msg.database, msg.queue, msg.key, types, msg.content_type, msg.priority,
                              msg.reply_to)
    queue, due = routed, msg.due if action == "delayed" else None
    if due is not None:
        headers["NServiceBus.DeliverAt"] = to_wire(due)
    elif action == "error":
        queue = target.error_queue
        headers.update(_failure_headers(msg.failure, msg.state, msg.system, msg.database, tables, routed))
    if mapping.headers.set:
        _set_headers(headers, mapping, msg.system, msg.database, msg.queue, msg.key, mid, routed, msg.state, types)
    out = Reshaped(headers, msg.body, None)
    if facts is not None and mapping.reshapes:
        values = _values(msg.system, msg.database, msg.queue, msg.key, mid, routed, msg.state, types)
        if (skipped := reshape(mapping, facts, out, values, due is None and action == "queue", msg.state, queue)) is not None:
            return skipped
    return Outgoing("queue" if due is None else "delayed", queue, out.headers, out.body, out.expires, due)


def _common_headers(legacy: dict[str, str], mapping: Mapping, tables: TargetTables, translated: frozenset[str], mid: str,
                    intent: str, time_sent: datetime, correlation_id: str | None, conversation_id: str | None, system: str,
                    database: str, queue: str, key: str, types: list[str], content_type: str | None, priority: int | None,
                    reply_to: str | None) -> dict[str, str]:
    """The headers of every message whatever its state: legacy ones mapped, derived ones, reply address, origin."""
    h = _legacy_headers(legacy, mapping, translated)
    h["NServiceBus.MessageId"] = mid
    h["NServiceBus.MessageIntent"] = intent
    h["NServiceBus.TimeSent"] = to_wire(time_sent)
    h["NServiceBus.CorrelationId"] = correlation_id or mid
    h["NServiceBus.ConversationId"] = conversation_id or mid
    h[ECHO_HEADER] = f"{system}://{database}/{queue}/{key}"
    if types:
        h["NServiceBus.EnclosedMessageTypes"] = types[0] if len(types) == 1 else ";".join(dict.fromkeys(types))
    if content_type:
        h["NServiceBus.ContentType"] = content_type
    if priority is not None:
        h["QBridge.Priority"] = str(priority)
    if reply_to:
        # Only an exact route translates a reply queue; '*' says where unknown messages go,
        # not where their senders listen, so an unrouted reply queue keeps its own name.
        h["NServiceBus.ReplyToAddress"] = _reply_address(reply_to, mapping, tables)
    h.setdefault("NServiceBus.OriginatingEndpoint", queue)
    h.setdefault("NServiceBus.OriginatingMachine", database)
    return h


def _values(system: str, database: str, queue: str, key: str, mid: str, routed: str, state: str, types: list[str]) -> dict[str, str]:
    """What a header template's placeholders stand for."""
    return {"system": system, "database": database, "queue": queue, "key": key, "message_id": mid,
            "destination": routed, "state": state, "type": types[0] if types else ""}


def _set_headers(headers: dict[str, str], mapping: Mapping, system: str, database: str, queue: str, key: str, mid: str,
                 routed: str, state: str, types: list[str]) -> None:
    """`[headers.set]`: templates over the message's coordinates and its other headers."""
    values = _values(system, database, queue, key, mid, routed, state, types)
    for name, template in mapping.headers.set.items():
        headers[name] = render_template(template, values, headers)


def _decide(mapping: Mapping, system: str, queue: str, destination: str, state: str, enclosed_types: Sequence[str],
            headers: dict[str, str], body: bytes | None) -> tuple[MessageFacts | None, Skipped | str | None]:
    """The message's facts for its rules (None without rules) and what `content_rules` decides."""
    if not mapping.has_rules:
        return None, None
    facts = MessageFacts(system, queue, destination, state, enclosed_types[0] if enclosed_types else "", headers, body)
    return facts, content_rules(mapping, facts)


def content_rules(mapping: Mapping, facts: MessageFacts) -> Skipped | str | None:
    """`[[skip]]` then `[[routes.rules]]`, in file order, over the message as read: Skipped
    (with the rule's name) by the first skip rule that holds, else the queue of the first route
    rule that holds, else None ([routes] decides)."""
    for i, rule in enumerate(mapping.skip):
        when = compiled(rule)
        if when is None or when.matches(facts):
            matched(f"skip[{i}] {rule.name!r}")
            return Skipped(f"skip {rule.name!r}")
    for i, route in enumerate(mapping.route_rules):
        when = compiled(route)
        if when is None or when.matches(facts):
            matched(f"routes.rules[{i}]")
            return route.to
    return None


def routing(enclosed_types: Sequence[str], destination: str, queue: str, mapping: Mapping) -> tuple[list[str], str | None]:
    """(the NServiceBus types, the routed queue) of a message; the same for every message of a
    queue with the same legacy types and destination, so worked out once per such combination."""
    memo: dict[tuple[tuple[str, ...], str, str], tuple[list[str], str | None]] = mapping.__dict__.setdefault("_routing", {})
    key = (tuple(enclosed_types), destination, queue)
    found = memo.get(key)
    if found is None:
        legacy_types = list(enclosed_types) or [n for n in (destination, queue) if n in mapping.types][:1]
        types = [mapped for t in legacy_types for mapped in mapping.map_types(t)]
        found = types, mapping.route([*enclosed_types, *types, destination, queue])
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


def _legacy_headers(headers: dict[str, str], mapping: Mapping, translated: frozenset[str]) -> dict[str, str]:
    # Messages of one queue mostly carry the same header names: one plan per name set.
    plans: dict[tuple[tuple[str, ...], frozenset[str]], list[tuple[str, str]]] = mapping.__dict__.setdefault("_header_plans", {})
    key = (tuple(headers), translated)
    plan = plans.get(key)
    if plan is None:
        plan = [(name, target) for name in headers if (target := mapping.header_target(name, translated)) is not None]
        if len(plans) < 1000:
            plans[key] = plan
    return {target: headers[name] for name, target in plan}


def _failure_headers(f: Failure | FailureInfo | None, state: str, system: str, database: str, tables: TargetTables,
                     routed: str) -> dict[str, str]:
    """What ServiceControl reads of a failed message: where it failed, and why (the legacy
    failure, or that the message was in a state it could not be delivered in)."""
    h = {
        "NServiceBus.FailedQ": tables.address(routed),
        "NServiceBus.ProcessingEndpoint": routed,
        "NServiceBus.ProcessingMachine": database,
    }
    if f is None:
        h["NServiceBus.ExceptionInfo.ExceptionType"] = "QBridge.LegacyMessageNotDeliverable"
        h["NServiceBus.ExceptionInfo.Message"] = f"the legacy message was {state} when qbridge read it"
        h["NServiceBus.ExceptionInfo.StackTrace"] = ""
        h["NServiceBus.TimeOfFailure"] = to_wire(utcnow())
        return h
    h["NServiceBus.ExceptionInfo.ExceptionType"] = f.exception_type
    h["NServiceBus.ExceptionInfo.Message"] = f.message[:MESSAGE_MAX]
    h["NServiceBus.ExceptionInfo.StackTrace"] = f.stack_trace
    h["NServiceBus.ExceptionInfo.Source"] = f"{system}:{f.failed_queue}"
    h["NServiceBus.TimeOfFailure"] = to_wire(f.time_of_failure)
    if f.inner_exception_type:
        h["NServiceBus.ExceptionInfo.InnerExceptionType"] = f.inner_exception_type
    return h
