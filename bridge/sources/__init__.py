"""Reading each system's queue tables into canonical messages, one module per system (with its
rollback give-back beside it), and the source registry: system name -> "module:Class",
imported when first asked for. A new system is a module here plus its codecs (docs/architecture.md).

May import: core, codecs, schemas.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    cls: type[Source] = lookup(REGISTRY, system, "source")
    return cls


def lookup(registry: dict[str, str], system: str, role: str) -> Any:
    """The class a registry names for `system`, imported now; UsageError for an unknown one."""
    try:
        where = registry[system]
    except KeyError:
        from bridge.errors import UsageError

        raise UsageError(f"{role} system {system!r} is not supported yet (supported: {', '.join(registry)})") from None
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)
