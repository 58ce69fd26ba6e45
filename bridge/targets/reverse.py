"""Routing, type names and headers of the reverse direction (NServiceBus -> a legacy system),
shared by the legacy targets.

A reverse job's mapping reads in the job's direction: `[routes]` maps an NServiceBus proxy
queue or message type to a legacy queue, `[headers.*]` act on the NServiceBus headers. `[types]`
keeps the forward spelling ("legacy type" = "NServiceBus type"), so one types table serves a
queue pair both ways; the reverse job looks it up backwards.
"""

from __future__ import annotations

from bridge.codecs.echo import ECHO_HEADER, echo_of
from bridge.errors import BadRow
from bridge.mapping import Mapping, render_template
from bridge.model import CanonicalMessage
from bridge.targets.base import Skipped

# NServiceBus headers a legacy endpoint can make sense of; the rest describe NServiceBus's
# own pipeline (or hold '=' and '|', as assembly-qualified type names do).
KEPT_NSB_HEADERS = frozenset({
    "NServiceBus.MessageId", "NServiceBus.ConversationId", "NServiceBus.OriginatingEndpoint",
    "NServiceBus.MessageIntent", "NServiceBus.RelatedTo",
})


def type_forms(name: str) -> list[str]:
    """An assembly-qualified .NET type name, then `FullName, Assembly`, then `FullName`."""
    parts = [p.strip() for p in name.split(",")]
    forms = [name.strip(), ", ".join(parts[:2]), parts[0]]
    return list(dict.fromkeys(f for f in forms if f))


class ReverseRules:
    """One reverse job's routes, reversed type table and header rules."""

    def __init__(self, mapping: Mapping) -> None:
        self.mapping = mapping
        self.legacy_names: dict[str, str] = {}
        for legacy, nsb in mapping.types.items():
            for form in type_forms(nsb):
                self.legacy_names.setdefault(form, legacy)

    def destination(self, msg: CanonicalMessage, system: str, identity: str) -> str | Skipped:
        """The legacy queue `msg` goes to, or why it is skipped: expired (the transport discards
        such a message too), or an echo of a message that came from that very queue."""
        if msg.state == "expired":
            return Skipped("expired before it was read (the transport discards such a message unprocessed)")
        queue = self.route(msg)
        came_from = echo_of(msg.headers.get(ECHO_HEADER), system, queue, identity)
        return queue if came_from is None else Skipped(came_from)

    @staticmethod
    def template_values(msg: CanonicalMessage, destination: str, legacy_type: str) -> dict[str, str]:
        """What `[headers.set]` templates can name, for a reverse message."""
        src = msg.source
        return {"system": src.system, "database": src.database, "queue": src.queue, "key": src.key,
                "message_id": src.key, "destination": destination, "state": msg.state, "type": legacy_type}

    def route(self, msg: CanonicalMessage) -> str:
        """The legacy queue: the first enclosed type with a route, else the proxy queue's."""
        candidates = [f for t in msg.enclosed_types for f in type_forms(t)] + [msg.destination]
        routed = self.mapping.route(candidates)
        if routed is None:
            raise BadRow(f"no route for proxy queue {msg.destination!r} or type "
                         f"{msg.enclosed_types[0] if msg.enclosed_types else '(none)'!r}; add one to [routes] (or a '*' route)")
        return routed

    def known_type(self, msg: CanonicalMessage) -> str | None:
        """The legacy type name of the message's most derived enclosed type with one, else None."""
        for t in msg.enclosed_types:
            for form in type_forms(t):
                if form in self.legacy_names:
                    return self.legacy_names[form]
        return None

    def legacy_type(self, msg: CanonicalMessage) -> str:
        """As `known_type`, for a legacy system that cannot take a message without one."""
        if not msg.enclosed_types:
            raise BadRow("no NServiceBus.EnclosedMessageTypes header: the legacy system needs a type name")
        found = self.known_type(msg)
        if found is None:
            raise BadRow(f"type {msg.enclosed_types[0]!r} has no legacy name; add "
                         f"\"Legacy.Type, LegacyAssembly\" = \"{type_forms(msg.enclosed_types[0])[1]}\" to [types]")
        return found

    def headers(self, msg: CanonicalMessage, values: dict[str, str]) -> dict[str, str]:
        """The NServiceBus headers a legacy message keeps, renamed, dropped and set as mapped."""
        rename = self.mapping.headers.rename
        out: dict[str, str] = {}
        for name, value in msg.headers.items():
            if name.startswith("NServiceBus.") and name not in KEPT_NSB_HEADERS and name not in rename:
                continue
            if name.startswith(("QBridge.", "$.")):  # qbridge's own tags, NServiceBus diagnostics
                continue
            target = self.mapping.header_target(name, frozenset())
            if target is not None:
                out[target] = value
        for name, template in self.mapping.headers.set.items():
            out[name] = render_template(template, values, out)
        return out
