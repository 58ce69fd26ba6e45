"""The one framework-owned loop every engine calls: read a batch, decode, map, write, commit.

JobRunner is assembled from its seams, one module each: the job's setup (pipeline/job.py), the
batch with its fast lane (pipeline/batch.py), the passes per cursor kind (pipeline/passes.py)
and Spark's units (pipeline/units.py). `sync --once`, `qbridge run`, `migrate`'s tasks and its
closing pass, quarantine replay and `verify --deep` all go through it.
"""

from __future__ import annotations

from bridge.pipeline.job import LedgerConflict, database_identity
from bridge.pipeline.stats import SCAN_CHUNK, PassStats, RangeResult, chunked
from bridge.pipeline.units import Units

__all__ = ["SCAN_CHUNK", "JobRunner", "LedgerConflict", "PassStats", "RangeResult", "chunked", "database_identity",
           "drain_progress"]


class JobRunner(Units):
    """Everything one job needs, built once per process, and the passes, batches and units run on it."""


def drain_progress(runner: JobRunner) -> int:
    """`with_backoff`'s `progress` for a drain on `runner`: the passes its drains committed (bridge.retry)."""
    return runner.passes_done
