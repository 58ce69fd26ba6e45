"""What the listener of `qbridge run` reads of a job worker: a read-only view.

The metrics collector and the status page show a worker's state; they must not drive it. They
import this protocol, which `bridge.service.scheduler.JobWorker` satisfies, so neither imports
the scheduler (which starts them), and no import goes round in a circle.
"""

from __future__ import annotations

from typing import Protocol

from bridge.pipeline.loop import JobRunner


class LockView(Protocol):
    """The job lock as the page and `/metrics` see it."""

    @property
    def held(self) -> bool: ...

    def holder(self) -> str: ...


class WorkerView(Protocol):
    """One job of `qbridge run`, as far as the listener reads it."""

    name: str
    runner: JobRunner  # the listener reads the job's config and books, and hooks on_batch
    failures: int  # failed runs in a row since the last success
    stopped_reason: str | None  # set when the job stopped for good
    last_success: float | None  # epoch seconds of the last run without an error
    last_error: str | None
    retries: dict[str, int]  # failed runs retried, by error class
    allowance: float  # seconds since the last successful run after which the job is not ready (/readyz)

    @property
    def lock(self) -> LockView: ...
