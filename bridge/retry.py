"""Retrying work that failed for a reason that passes (a database restarting, a deadlock)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from bridge.db import is_retryable

T = TypeVar("T")
log = logging.getLogger("qbridge.retry")


def with_backoff(
    work: Callable[[], T],
    what: str,
    attempts: int = 5,
    first_delay: float = 1.0,
    max_delay: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[], int] | None = None,
) -> T:
    """Runs `work`; a retryable failure is logged in one line and retried with doubling delays.
    `progress`, when given, counts what `work` has committed so far (a drain's passes): a failure
    after progress starts the count and the delay afresh, so `attempts` is per batch, and a long
    drain over a flaky link slows down only by the blips it meets."""
    delay = first_delay
    attempt = 1
    while True:
        before = progress() if progress else 0
        try:
            return work()
        except Exception as e:
            if progress and progress() > before:
                attempt, delay = 1, first_delay  # a batch committed since the last failure
            if not is_retryable(e) or attempt >= attempts:
                raise
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()
            log.warning("%s failed (%s); attempt %d of %d, retrying in %.1fs",
                        what, reason[0] if reason else type(e).__name__, attempt, attempts, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay)
            attempt += 1
