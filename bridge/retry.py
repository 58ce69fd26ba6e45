"""Retrying work that failed for a reason that passes (a database restarting, a deadlock)."""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from bridge.db import cause_of, is_retryable

T = TypeVar("T")
log = logging.getLogger("qbridge.retry")


BLIP = 0.1  # the first wait of a batch's retries: a connection cut on a flaky link comes back at once


# Retries so far of the work with_backoff runs now (its spans say so: bridge.tracing).
RETRIES: contextvars.ContextVar[int] = contextvars.ContextVar("qbridge_retries", default=0)


def with_backoff(
    work: Callable[[], T],
    what: str,
    attempts: int = 6,
    max_delay: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[], int] | None = None,
) -> T:
    """Runs `work`; a retryable failure is logged in one line and retried, waiting BLIP (a cut
    connection comes back at once), then 1, 2, 4, 8 s ... (a database restarting); an error
    waiting cannot fix (bridge.db.is_retryable) is raised at once. `progress`, when given, counts
    what `work` has committed so far (a drain's passes): the attempts are then per batch, and a
    failure after progress starts them afresh, so a long drain over a flaky link slows down only
    by the blips it meets, while a database that stays down still runs them out."""
    def fresh() -> tuple[int, float]:
        return 1, BLIP

    attempt, delay = fresh()
    while True:
        before = progress() if progress else 0
        token = RETRIES.set(attempt - 1)
        try:
            return work()
        except Exception as e:
            if progress and progress() > before:
                attempt, delay = fresh()  # a batch committed since the last failure
            if not is_retryable(e) or attempt >= attempts:
                raise
            told = cause_of(e)
            reason = str(getattr(told, "orig", None) or told).strip().splitlines()
            log.warning("%s failed (%s); attempt %d of %d, retrying in %.1fs",
                        what, reason[0] if reason else type(told).__name__, attempt, attempts, delay)
            sleep(delay)
            delay = 1.0 if delay < 1.0 else min(delay * 2, max_delay)
            attempt += 1
        finally:
            RETRIES.reset(token)
