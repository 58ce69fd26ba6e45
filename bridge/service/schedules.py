"""A job's schedule in `qbridge run`: its APScheduler trigger, how long after a run it still counts
as ready, and how its start line says it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bridge.config import JobConfig
from bridge.timefmt import parse_duration

DEFAULT_EVERY = "10s"  # a job without a schedule in `qbridge run`


def trigger_for(job: JobConfig) -> BaseTrigger:
    schedule = job.schedule
    if schedule is not None and schedule.cron is not None:
        return CronTrigger.from_crontab(schedule.cron, timezone=UTC)
    every = schedule.every if schedule is not None and schedule.every else DEFAULT_EVERY
    return IntervalTrigger(seconds=parse_duration(every), timezone=UTC)


def readiness_allowance(job: JobConfig) -> float:
    """How long after its last successful run a job still counts as ready: three of its
    schedule's intervals (a cron's first two fire times apart), a minute at least."""
    trigger = trigger_for(job)
    if isinstance(trigger, IntervalTrigger):
        interval = trigger.interval.total_seconds()
    else:
        first = trigger.get_next_fire_time(None, datetime.now(UTC))
        second = trigger.get_next_fire_time(first, first) if first else None
        if second == first and first is not None:
            second = trigger.get_next_fire_time(first, first + timedelta(seconds=1))
        interval = (second - first).total_seconds() if first and second else 3600.0
    return max(60.0, 3 * interval)


def describe(job: JobConfig) -> str:
    """A job's schedule as its start line says it."""
    if job.schedule and job.schedule.cron:
        return f"cron {job.schedule.cron} UTC"
    return f"every {job.schedule.every if job.schedule and job.schedule.every else DEFAULT_EVERY}"
