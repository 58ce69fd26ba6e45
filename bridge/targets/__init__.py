"""Writing canonical messages into each system's tables, one module per system (the envelope,
writer and bulk helpers of the NServiceBus side beside it), and the target registry: system
name -> "module:Class", imported when first asked for.

May import: core, codecs, schemas, sources.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.targets.base import Target

REGISTRY: dict[str, str] = {
    "nservicebus": "bridge.targets.nservicebus:NServiceBusTarget",
    "nginn": "bridge.targets.nginn:NGinnTarget",
    "openjms": "bridge.targets.openjms:OpenJMSTarget",
    "biztalk": "bridge.targets.biztalk:BizTalkTarget",
}


def target_class(system: str) -> type[Target]:
    """The Target class for `system`; a clear error for one qbridge cannot write yet."""
    from bridge.sources import lookup

    cls: type[Target] = lookup(REGISTRY, system, "target")
    return cls
