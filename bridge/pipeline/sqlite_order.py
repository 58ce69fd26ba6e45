"""A pass whose source and target are both SQLite files first takes an flock beside the
lower-named of the two, and holds it for the pass (threads of one process and other processes
alike queue on it).

Why: SQLite locks a whole file, and qbridge's transactions there begin IMMEDIATE. A pass locks
its source, then its target; a job the other way between the same two files (the demo's
nginn-orders and nginn-replies, under `qbridge run`) locks them in the other order. With traffic
both ways each held one file and waited for the other until SQLite's 30 s busy timeout failed
both, and their equal back-offs met again: two batches in a minute (2026-11-29). In any cycle of
such waits two passes want the cycle's lowest-named file; both take its flock first, so one of
them waits before it holds anything. Passes on one SQLite file, or none, take nothing.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bridge.db import sqlite_file
from bridge.errors import RetryableError

WAIT_SECONDS = 30.0  # as long as SQLite's own busy timeout (bridge.db)


@contextmanager
def sqlite_pass_order(source_url: str, target_url: str, wait: float = WAIT_SECONDS) -> Iterator[None]:
    files = {f for f in (sqlite_file(source_url), sqlite_file(target_url)) if f is not None}
    if len(files) < 2:
        yield
        return
    first = min(files)
    path = first.with_name(first.name + ".qbridge-pass.lock")
    with open(path, "a") as f:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RetryableError(f"another pass between {', '.join(sorted(map(str, files)))} held {path} "
                                         f"for {wait:.0f} s") from None
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
