"""How `qbridge` writes its log lines on stderr: text for a terminal (the default), or one JSON
object a line for a log pipeline (`--log-format json`, or QBRIDGE_LOG_FORMAT=json).

A JSON line has `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, the
`job` and `queue` the line is about when it names them (`job=NAME queue=NAME`, or `job 'NAME'`),
`trace_id` and `span_id` when a span is current (issue 39's tracing), and `exception` with the
traceback when there is one. Messages are the text lines' messages: what those mask (database
passwords, bridge.config.mask_url) is masked here the same way, as they are built before either
format sees them.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from datetime import UTC, datetime

import orjson

FORMATS = ("text", "json")
FORMAT_ENV = "QBRIDGE_LOG_FORMAT"
TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"

_JOB = re.compile(r"\bjob[= ]'?([A-Za-z0-9_.\-]+)'?")
_QUEUE = re.compile(r"\bqueue[= ]'?([^\s',;:()]+)'?")


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
        }
        job = getattr(record, "job", None) or _first(_JOB, message)
        queue = getattr(record, "queue", None) or _first(_QUEUE, message)
        if job:
            line["job"] = job
        if queue:
            line["queue"] = queue
        trace = current_trace()
        if trace is not None:
            line["trace_id"], line["span_id"] = trace
        line["message"] = message
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def _first(pattern: re.Pattern[str], text: str) -> str | None:
    m = pattern.search(text)
    return m.group(1) if m else None


def current_trace() -> tuple[str, str] | None:
    """The current span's trace and span ids as hex, where OpenTelemetry is loaded and a span is recording."""
    trace_api = sys.modules.get("opentelemetry.trace")
    if trace_api is None:
        return None
    ctx = trace_api.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def log_format(given: str | None) -> str:
    """--log-format, else QBRIDGE_LOG_FORMAT, else text; a bad value names itself."""
    chosen = given or os.environ.get(FORMAT_ENV) or "text"
    if chosen not in FORMATS:
        from bridge.errors import UsageError

        raise UsageError(f"log format {chosen!r} (from {'--log-format' if given else FORMAT_ENV}): expected text or json")
    return chosen


def configure(level: str, fmt: str) -> None:
    """As logging.basicConfig: a process whose root logger has handlers already (a host
    application, pytest's caplog) keeps them."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=getattr(logging, level), handlers=[handler])
