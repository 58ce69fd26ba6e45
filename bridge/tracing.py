"""OpenTelemetry spans (issue 39), on when an exporter is configured by the standard OTEL_*
environment variables, free when not: without them OpenTelemetry is never imported, and a span
is a shared object whose `with` does nothing.

On: OTEL_TRACES_EXPORTER=otlp (or console) or an OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, unless
OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. OTLP goes over HTTP/protobuf (the SDK's
exporter, a dependency), or gRPC with OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL=grpc once
`opentelemetry-exporter-otlp-proto-grpc` is installed. Spans are batched and sent on a thread
of the SDK; `flush()` at the end of a command sends what is left.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

SERVICE = "qbridge"
_state: dict[str, Any] = {"tracer": None, "provider": None, "checked": False}


def configured() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter) or bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def use(provider: Any) -> None:
    """Spans go to this TracerProvider from now on (tests give one with an in-memory exporter)."""
    _state.update(provider=provider, tracer=provider.get_tracer(SERVICE) if provider is not None else None, checked=True)


def _tracer() -> Any:
    if not _state["checked"]:
        _state["checked"] = True
        if configured():
            _state["provider"] = _provider()
            _state["tracer"] = _state["provider"].get_tracer(SERVICE)
    return _state["tracer"]


def _provider() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SERVICE)}))
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if kind == "console":
        exporter: Any = ConsoleSpanExporter()
    else:
        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                    or "http/protobuf")
        if protocol == "grpc":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            except ImportError:
                from bridge.errors import DriverMissing

                raise DriverMissing("OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: pip install "
                                    "opentelemetry-exporter-otlp-proto-grpc (or use http/protobuf)") from None
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


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


def traceparent() -> str | None:
    """The current span as a W3C `traceparent` header (the header NServiceBus reads), or None."""
    if _state["tracer"] is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    # Only the sampled flag: W3C level 1 parsers know no other (the SDK sets level 2's random one).
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 0x01:02x}"


def flush() -> None:
    provider = _state["provider"]
    if provider is not None:
        provider.force_flush()


_TRACEPARENT = re.compile(r'"traceparent"\s*:\s*"(00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})"')


def link_messages(header_texts: Iterable[str]) -> None:
    """Links the current span to the traces the messages arrived with (their `traceparent`, in
    NServiceBus header JSON): a reverse job's batch span points at each sender's span. The SDK
    keeps at most OTEL_SPAN_LINK_COUNT_LIMIT links a span (128)."""
    if _state["tracer"] is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanContext, TraceFlags

    current = trace.get_current_span()
    seen = set()
    for text in header_texts:
        m = _TRACEPARENT.search(text or "")
        if m is None or m.group(1) in seen:
            continue
        seen.add(m.group(1))
        _, trace_id, span_id, flags = m.group(1).split("-")
        if int(trace_id, 16) and int(span_id, 16):
            current.add_link(SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))))
