"""The target registry: system name -> "module:Class", imported when first asked for."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.targets.base import Target

REGISTRY: dict[str, str] = {
    "nservicebus": "bridge.targets.nservicebus_target:NServiceBusTarget",
    "nginn": "bridge.targets.nginn:NGinnTarget",
}


def target_class(system: str) -> type[Target]:
    """The Target class for `system`; a clear error for one qbridge cannot write yet."""
    try:
        where = REGISTRY[system]
    except KeyError:
        from bridge.errors import UsageError

        raise UsageError(f"target system {system!r} is not supported yet (supported: {', '.join(REGISTRY)})") from None
    module, _, name = where.partition(":")
    cls: type[Target] = getattr(importlib.import_module(module), name)
    return cls
