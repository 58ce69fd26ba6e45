"""What a log line is about, and the two formats qbridge writes log lines in (issue 39).

The `job` and `queue` of a JSON line come from a context set where a job's work runs (a pass, a
drain, a Spark unit, a scheduled run), never from the message's words: "every job has stopped"
names no job. The context is a contextvar, so each thread (APScheduler's pool) and each Spark
task sees only its own; a line logged outside any job carries no `job` key.

The formats live here, below the command line, because Spark's Python workers must apply the
driver's format too (`for_spark_task`), and they never run the command line.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

import orjson

from bridge import tracing

FORMATS = ("text", "json")
FORMAT_ENV = "QBRIDGE_LOG_FORMAT"
TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"
WORKER_LEVEL = "WARNING"  # a Spark task's per-batch INFO lines would bury the driver's

_about: ContextVar[tuple[str | None, str | None]] = ContextVar("qbridge_log_about", default=(None, None))
_chosen: dict[str, str] = {}

# A URL's password (scheme://user:password@): qbridge's messages mask theirs when built
# (config.mask_url); an exception's text, or a library's message, is whatever a driver put in it,
# so every line is masked again on the way out, in either format.
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^:/@\s'\"]*:)[^@/\s'\"]+(@)")


@contextmanager
def about(job: str, queue: str | None = None) -> Iterator[None]:
    """Log lines written inside are about this job (and queue)."""
    token = _about.set((job, queue))
    try:
        yield
    finally:
        _about.reset(token)


def current() -> tuple[str | None, str | None]:
    """The job and queue of the work running in this thread, (None, None) outside any."""
    return _about.get()


def mask(text: str) -> str:
    return _URL_PASSWORD.sub(r"\1***\2", text)


class TextFormatter(logging.Formatter):
    """`time level logger message`, and the traceback under it."""

    def __init__(self) -> None:
        super().__init__(TEXT)

    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
        }
        job, queue = current()
        job = getattr(record, "job", None) or job  # logging's extra={"job": ...} says it outright
        queue = getattr(record, "queue", None) or queue
        if job:
            line["job"] = job
        if queue:
            line["queue"] = queue
        trace = tracing.current_ids()
        if trace is not None:
            line["trace_id"], line["span_id"] = trace
        line["message"] = mask(record.getMessage())
        if record.exc_info:
            line["exception"] = mask(self.formatException(record.exc_info))
        return orjson.dumps(line).decode()


def configure(level: str, fmt: str) -> None:
    """As logging.basicConfig: a process whose root logger has handlers already (a host
    application, pytest's caplog) keeps them. `fmt` is remembered for Spark's workers."""
    _chosen["format"] = fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=getattr(logging, level), handlers=[handler])


def chosen_format() -> str | None:
    """The format `configure` set in this process (None: never called)."""
    return _chosen.get("format")


def for_spark_task() -> None:
    """In a Spark task's Python worker: log as the driver does, in the format it forwarded as
    QBRIDGE_LOG_FORMAT (spark_context puts it in the executors' environment). Once a process:
    workers are reused between tasks."""
    if "format" in _chosen:
        return
    fmt = os.environ.get(FORMAT_ENV, "")
    if fmt in FORMATS:
        configure(WORKER_LEVEL, fmt)
    else:
        _chosen["format"] = ""  # nothing forwarded (or a value the driver refused): Python's default


def executor_env() -> dict[str, str]:
    """What Spark's executors need in their environment to log as this driver does."""
    fmt = chosen_format()
    return {FORMAT_ENV: fmt} if fmt else {}
