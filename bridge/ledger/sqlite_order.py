"""A pass whose source and target are both SQLite files first takes an flock beside the
lower-named of the two, and holds it for the pass (threads of one process and other processes
alike queue on it); so do the other holders of both files' write locks: a Spark unit's batch,
pending consumes and give-backs outside a pass (rollback, a job's check, quarantine replay).

Why: SQLite locks a whole file, and qbridge's transactions there begin IMMEDIATE. A pass locks
its source, then its target; a job the other way between the same two files (the demo's
nginn-orders and nginn-replies, under `qbridge run`) locks them in the other order. With traffic
both ways each held one file and waited for the other until SQLite's 30 s busy timeout failed
both, and their equal back-offs met again: two batches in a minute (2026-11-29). In any cycle of
such waits two passes want the cycle's lowest-named file; both take its flock first, so one of
them waits before it holds anything. Passes on one SQLite file, or none, take nothing. The
holder may be any of them: the timeout's message names the lock file, not "a pass".
"""

from __future__ import annotations

import fcntl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bridge.db import sqlite_file
from bridge.errors import RetryableError

WAIT_SECONDS = 30.0  # as long as SQLite's own busy timeout (bridge.db)
# The order locks this thread holds: a pass's give-back, pending consumes (which take it too, as
# do rollback, check() and Spark units outside a pass) take it again without a second flock, which
# on a new file descriptor would wait on this thread's own.
_held = threading.local()


@contextmanager
def sqlite_pass_order(source_url: str, target_url: str, wait: float = WAIT_SECONDS) -> Iterator[None]:
    files = {f for f in (sqlite_file(source_url), sqlite_file(target_url)) if f is not None}
    if len(files) < 2:
        yield
        return
    first = min(files)
    path = first.with_name(first.name + ".qbridge-pass.lock")
    held: set = _held.__dict__.setdefault("paths", set())
    if path in held:
        yield
        return
    try:
        f = open(path, "a")  # noqa: SIM115 - closed below, after the yield
    except OSError:
        # No descriptor to spare for a moment, or a directory qbridge cannot write: the pass goes
        # on unordered, as before this lock, and SQLite says what is wrong with its own files
        # (a shortage of descriptors is retried there: tests/review/test_session3_review.py).
        f = None
    if f is None:
        yield
        return
    with f:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RetryableError(f"another qbridge process or thread (a pass, a Spark unit, a rollback or a give-back) "
                                         f"between {', '.join(sorted(map(str, files)))} held {path} for {wait:.0f} s") from None
                time.sleep(0.01)
        held.add(path)
        try:
            yield
        finally:
            held.discard(path)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
