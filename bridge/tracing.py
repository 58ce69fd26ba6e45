"""OpenTelemetry spans (issue 39), on when an exporter is configured by the standard OTEL_*
environment variables, free when not: without them OpenTelemetry is never imported, and a span
is a shared object whose `with` does nothing.

On: OTEL_TRACES_EXPORTER=otlp and/or console (a comma-separated list), or an
OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none.
OTLP goes over HTTP/protobuf (the SDK's exporter, a dependency), or gRPC with
OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL=grpc once `opentelemetry-exporter-otlp-proto-grpc` is
installed. Spans are batched and sent on a thread of the SDK; `flush()` at the end of a command
sends what is left.

A value qbridge cannot honour is a config error (exit 2) naming the variable, not a silent
fallback. The specification asks for a warning and the default instead (its "Enum" rule), but
the Python SDK's own set-up refuses such values too, and a warning scrolled past in a service's
log leaves the spans going somewhere nobody looks.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

SERVICE = "qbridge"
EXPORTERS = ("otlp", "console")
PROTOCOLS = ("http/protobuf", "grpc")
_state: dict[str, Any] = {"tracer": None, "provider": None, "checked": False}
# `qbridge run` starts its jobs' first spans on APScheduler's threads at once: one builds the
# provider, the others wait for it rather than run untraced.
_start = threading.Lock()


def configured() -> bool:
    """Whether spans are exported; raises ConfigError for an OTEL_* value qbridge cannot honour."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporters()
    if not exporters:
        return False
    on = bool(env.get("OTEL_TRACES_EXPORTER", "").strip() or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
              or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())
    if on and "otlp" in exporters:
        _protocol()  # a bad protocol is refused before anything moves, not at the first span
    return on


def _exporters() -> list[str]:
    """OTEL_TRACES_EXPORTER's exporters, in order ("otlp" when unset; none for `none`)."""
    raw = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    names = list(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise _config_error("OTEL_TRACES_EXPORTER", raw, f"qbridge exports spans with {' or '.join(EXPORTERS)} "
                            "(a comma-separated list), or none to turn them off")
    return names or ["otlp"]


def _protocol() -> str:
    """The OTLP protocol: the traces variable, else the general one, else http/protobuf; any case."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        if raw.lower() in PROTOCOLS:
            return raw.lower()
        if raw.lower() == "http/json":
            raise _config_error(name, raw, "the OpenTelemetry Python SDK has no OTLP/HTTP JSON exporter; use "
                                "http/protobuf (the same collector port, 4318) or grpc")
        raise _config_error(name, raw, f"qbridge sends OTLP as {' or '.join(PROTOCOLS)}")
    return "http/protobuf"


def _config_error(name: str, value: str, expected: str) -> Exception:
    from bridge.errors import ConfigError

    return ConfigError(name, [f"{value!r}: {expected}"])


def use(provider: Any) -> None:
    """Spans go to this TracerProvider from now on (tests give one with an in-memory exporter)."""
    with _start:
        _state.update(provider=provider, tracer=provider.get_tracer(SERVICE) if provider is not None else None, checked=True)


def reset() -> None:
    """Forgets the provider: the next span looks at the environment again (tests)."""
    with _start:
        _state.update(provider=None, tracer=None, checked=False)


def _tracer() -> Any:
    if _state["checked"]:
        return _state["tracer"]
    with _start:
        if not _state["checked"]:
            # Marked checked only once the provider is there: a start that failed (a bad value,
            # a missing exporter) raises again at the next span, never degrades to no spans.
            provider = _provider() if configured() else None
            _state.update(provider=provider, tracer=provider.get_tracer(SERVICE) if provider is not None else None)
            _state["checked"] = True
    return _state["tracer"]


def _provider() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    exporters: list[Any] = []
    for kind in _exporters():
        if kind == "console":
            exporters.append(ConsoleSpanExporter(out=sys.stderr))  # stdout carries --json documents
        elif _protocol() == "grpc":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
            except ImportError:
                from bridge.errors import DriverMissing

                raise DriverMissing("OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: pip install "
                                    "opentelemetry-exporter-otlp-proto-grpc (or use http/protobuf)") from None
            exporters.append(Grpc())
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

            exporters.append(Http())
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SERVICE)}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


@contextmanager
def retrying(n: int) -> Iterator[None]:
    """Work run under this is a retry after `n` failed attempts: the first batch span it starts
    says `qbridge.retries = n`; a batch that commits makes the next one's count 0 again (a drain
    resets bridge.retry.RETRIES after each pass). `qbridge run`'s back-off uses it."""
    from bridge.retry import RETRIES

    token = RETRIES.set(n)
    try:
        yield
    finally:
        RETRIES.reset(token)


class _Nothing:
    """The span when tracing is off: every call does nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, values: dict[str, Any]) -> None:
        pass

    def record_exception(self, exc: BaseException) -> None:
        pass


NOTHING = _Nothing()


@contextmanager
def span(name: str, parent: str | None = None, **attributes: Any) -> Iterator[Any]:
    """A span named `name` under the current one, or under `parent` (a `traceparent` another
    process handed on: a Spark task's under its driver's), with `qbridge.*` attributes; its
    exception, if one leaves it, is recorded and re-raised."""
    tracer = _tracer()
    if tracer is None:
        yield NOTHING
        return
    context = None
    if parent:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    with tracer.start_as_current_span(name, context=context,
                                      attributes={f"qbridge.{k}": v for k, v in attributes.items() if v is not None}) as s:
        yield s


def counts(s: Any, stats: Any) -> None:
    """A batch's or a pass's numbers on its span."""
    if s is not NOTHING:
        s.set_attributes({"qbridge.read": stats.read, "qbridge.delivered": stats.delivered, "qbridge.skipped": stats.skipped,
                          "qbridge.quarantined": stats.quarantined, "qbridge.already": stats.already,
                          "qbridge.consumed": stats.consumed})


def _current_context() -> Any:
    """The current span's context, or None (tracing off, or no span recording)."""
    if _state["tracer"] is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return ctx if ctx.is_valid else None


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids as hex (a log line carries them), or None."""
    ctx = _current_context()
    return None if ctx is None else (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")


def traceparent() -> str | None:
    """The current span as a W3C `traceparent` header (the header NServiceBus reads), or None."""
    ctx = _current_context()
    if ctx is None:
        return None
    # Only the sampled flag: W3C level 1 parsers know no other (the SDK sets level 2's random one).
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 0x01:02x}"


_HEX = frozenset("0123456789abcdef")


def valid_traceparent(value: object) -> bool:
    """Whether NServiceBus's receive can parse `value` as its parent: .NET's ActivityContext.TryParse
    (exactly 55 characters; a version of two lowercase hex digits, not ff; a trace id of 32 and a
    parent id of 16 lowercase hex digits, neither all zeros; two lowercase hex digits of flags),
    with the dashes W3C trace context level 1 puts between them (.NET does not look at those)."""
    if not isinstance(value, str) or len(value) != 55 or value[2] != "-" or value[35] != "-" or value[52] != "-":
        return False
    version, trace_id, parent_id, flags = value[:2], value[3:35], value[36:52], value[53:]
    return (set(version + trace_id + parent_id + flags) <= _HEX and version != "ff"
            and trace_id != "0" * 32 and parent_id != "0" * 16)


# The same rules on a header in NServiceBus header JSON, for Arrow's RE2 (which has no
# look-ahead): a value VALID matches and ZEROS does not is kept; ANY is a value to replace (its
# group 1 kept). Each starts at the `{` or `,` before the name: in JSON as orjson writes it (no
# spaces) that is where a name, and only a name, starts, since a `"` inside a string is escaped;
# a header named `x"traceparent` (`"x\"traceparent":`) is another header.
TRACEPARENT_JSON_VALID = r'[{,]"traceparent":"([0-9a-e][0-9a-f]|f[0-9a-e])-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}"'
TRACEPARENT_JSON_ZEROS = r'[{,]"traceparent":"[0-9a-f]{2}-(0{32}-[0-9a-f]{16}|[0-9a-f]{32}-0{16})-'
TRACEPARENT_JSON_ANY = r'([{,])"traceparent":"(?:[^"\\]|\\.)*"'


def flush() -> None:
    provider = _state["provider"]
    if provider is not None:
        provider.force_flush()


TRACEPARENT = "traceparent"  # NServiceBus's Headers.DiagnosticsTraceParent
_TRACEPARENT = re.compile(r'00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}')


def link_messages(header_texts: Iterable[str | None]) -> None:
    """Links the current span to the traces the messages arrived with (their `traceparent`, in
    NServiceBus header JSON): a reverse job's batch span points at each sender's span. The SDK
    keeps at most OTEL_SPAN_LINK_COUNT_LIMIT links a span (128)."""
    if _state["tracer"] is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanContext, TraceFlags

    current = trace.get_current_span()
    seen = set()
    import orjson

    for text in header_texts:
        try:  # the header by its parsed name: `x"traceparent` is another header
            value = orjson.loads(text or "{}").get(TRACEPARENT)
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if not isinstance(value, str) or not _TRACEPARENT.fullmatch(value) or value in seen:
            continue
        seen.add(value)
        _, trace_id, span_id, flags = value.split("-")
        if int(trace_id, 16) and int(span_id, 16):
            current.add_link(SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))))
