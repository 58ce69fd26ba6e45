"""Named points where a test can freeze a real qbridge process, to kill it there.

`QBRIDGE_FAULT_PAUSE=<point>[:<n>]` makes the process, at the n-th time (default 1st) it reaches
`<point>`, write `QBRIDGE_FAULT_FILE` and sleep until killed (or for `QBRIDGE_FAULT_PAUSE_SECONDS`,
or until the file `QBRIDGE_FAULT_RESUME_FILE` exists, at most those seconds). `QBRIDGE_FAULT_FAIL=<point>` raises
there instead, on the first attempt of a Spark task (never outside Spark). Unset, `reached`
costs two dict lookups.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_counts: dict[str, int] = {}
attempt: int | None = None  # the Spark task attempt running in this process; None outside Spark


class InjectedFault(RuntimeError):
    """Raised where `QBRIDGE_FAULT_FAIL=<point>` asks, on a task's first attempt only."""


def reached(point: str) -> None:
    if attempt == 0 and os.environ.get("QBRIDGE_FAULT_FAIL") == point:
        marker = os.environ.get("QBRIDGE_FAULT_FILE")
        if marker:
            with open(marker, "a") as f:
                f.write(f"{os.getpid()} {point} failed\n")
        raise InjectedFault(f"injected fault at {point} (QBRIDGE_FAULT_FAIL)")
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
    limit = os.environ.get("QBRIDGE_FAULT_PAUSE_SECONDS")
    resume = os.environ.get("QBRIDGE_FAULT_RESUME_FILE")
    if resume:  # a pause the test ends once what must happen meanwhile has happened
        deadline = time.monotonic() + float(limit or 3600)
        while not os.path.exists(resume) and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    if limit:  # a pause that ends: for signals sent while work is in flight
        time.sleep(float(limit))
        return
    while True:
        time.sleep(3600)
