"""The compiled readers (setup.py builds them at install with the machine's C compiler), found
at import: each is held to the pure-Python reader it stands in for, which runs when it is absent.

QBRIDGE_COMPILED_READERS=0 leaves them unused: the benchmarks' reference run (docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

log = logging.getLogger("qbridge.codecs")
_told: set[str] = set()


def wanted() -> bool:
    return os.environ.get("QBRIDGE_COMPILED_READERS") != "0"


def compiled(module: str, name: str) -> Any | None:
    """bridge.codecs.<module>.<name>, or None when it was not built (or is not wanted)."""
    if not wanted():
        return None
    try:
        return getattr(importlib.import_module(f"bridge.codecs.{module}"), name)
    except ImportError:
        return None


def tell_missing(module: str, what: str) -> None:
    """A WARNING, once a process, that `what` runs on the slower pure-Python reader."""
    if module in _told or not wanted():
        return
    _told.add(module)
    log.warning("%s are read by the pure-Python reader: bridge.codecs.%s was not built (no C compiler when qbridge "
                "was installed?); install gcc, the Python headers and zlib's (Debian: zlib1g-dev) and reinstall qbridge "
                "for a reader about 5x faster",
                what, module)
