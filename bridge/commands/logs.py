"""How `qbridge` writes its log lines on stderr: text for a terminal (the default), or one JSON
object a line for a log pipeline (`--log-format json`, or QBRIDGE_LOG_FORMAT=json).

A JSON line has `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, the `job` and
`queue` whose work wrote it (bridge.pipeline.logcontext: a context set where a pass, a drain, a
Spark unit or a scheduled run goes on; none outside), `trace_id` and `span_id` when a span is
current (issue 39's tracing), `message`, and `exception` with the traceback when there is one.
Messages are the text lines' messages: what those mask (database passwords,
bridge.config.mask_url) is masked here the same way, as they are built before either format sees
them; a URL's password in an exception's text is masked by both formats.

The formatters live in the pipeline, as Spark's workers apply them too; this module is the
command line's side: which format was asked for, refused when it is neither.
"""

from __future__ import annotations

import os

from bridge.pipeline.logcontext import FORMAT_ENV, FORMATS


def log_format(given: str | None) -> str:
    """--log-format, else QBRIDGE_LOG_FORMAT, else text; a bad value names itself."""
    chosen = given or os.environ.get(FORMAT_ENV) or "text"
    if chosen not in FORMATS:
        from bridge.errors import UsageError

        raise UsageError(f"log format {chosen!r} (from {'--log-format' if given else FORMAT_ENV}): expected text or json")
    return chosen
