"""The source registry: system name -> "module:Class", imported when first asked for."""

from __future__ import annotations

import importlib

from bridge.sources.base import Source, SourceRow, Subscription

REGISTRY: dict[str, str] = {
    "nginn": "bridge.sources.nginn:NGinnSource",
    "openjms": "bridge.sources.openjms:OpenJMSSource",
    "biztalk": "bridge.sources.biztalk:BizTalkSource",
    "nservicebus": "bridge.sources.nservicebus:NServiceBusSource",
}

__all__ = ["REGISTRY", "Source", "SourceRow", "Subscription", "source_class"]


def source_class(system: str) -> type[Source]:
    """The Source class for `system`; a clear error for one qbridge cannot read yet."""
    try:
        target = REGISTRY[system]
    except KeyError:
        from bridge.errors import UsageError

        raise UsageError(f"source system {system!r} is not supported yet (supported: {', '.join(REGISTRY)})") from None
    module, _, name = target.partition(":")
    cls: type[Source] = getattr(importlib.import_module(module), name)
    return cls
