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
) -> T:
    """Runs `work`; a retryable failure is logged in one line and retried with doubling delays."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except Exception as e:
            if not is_retryable(e) or attempt == attempts:
                raise
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()
            log.warning("%s failed (%s); attempt %d of %d, retrying in %.1fs",
                        what, reason[0] if reason else type(e).__name__, attempt, attempts, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")
