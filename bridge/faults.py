"""Named points where a test can freeze a real qbridge process, to kill it there.

`QBRIDGE_FAULT_PAUSE=<point>[:<n>]` makes the process, at the n-th time (default 1st) it reaches
`<point>`, write `QBRIDGE_FAULT_FILE` and sleep until killed. Unset, `reached` costs one dict lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_counts: dict[str, int] = {}


def reached(point: str) -> None:
    spec = os.environ.get("QBRIDGE_FAULT_PAUSE")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] != int(nth or 1):
        return
    marker = os.environ.get("QBRIDGE_FAULT_FILE")
    if marker:
        Path(marker).write_text(f"{os.getpid()} {point}\n")
    while True:
        time.sleep(3600)
