"""What the tests run on loopback to receive what qbridge sends out: any HTTP POST (a webhook,
a sink that answers 200), and OTLP spans over HTTP or gRPC, decoded with the OpenTelemetry
protocol's own classes; and a `sync --once` that exports to one of them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from helpers import Bridge


def without_otel(**extra: str) -> dict[str, str]:
    """This process's environment without tracing settings of its own, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **extra}


class PostReceiver:
    """Takes every POST on 127.0.0.1 (a free port), hands its body to `take`, answers 200."""

    def __init__(self, take: Callable[[bytes], None] = lambda body: None, content_type: str | None = None) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                take(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(200)
                if content_type:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def _spans_of(request: Any) -> list[tuple[str | None, Any]]:
    """(service.name, span) of each span of an ExportTraceServiceRequest."""
    out = []
    for resource in request.resource_spans:
        service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
        for scope in resource.scope_spans:
            out += [(service, s) for s in scope.spans]
    return out


class OtlpReceiver:
    """An OTLP/HTTP receiver: POST /v1/traces, a protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list = []

        def take(body: bytes) -> None:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            self.spans += _spans_of(request)

        self._http = PostReceiver(take, content_type="application/x-protobuf")
        self.url = self._http.url

    def stop(self) -> None:
        self._http.stop()


class GrpcReceiver:
    """An OTLP/gRPC receiver: the collector's TraceService, from the protocol's own generated
    classes, on a grpcio server."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.spans: list = []
        receiver = self

        class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the protocol's name
                receiver.spans += _spans_of(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.stop(None)


def sync_exporting(tmp_path: Path, receiver: OtlpReceiver | GrpcReceiver, **otel: str
                   ) -> tuple[Bridge, subprocess.CompletedProcess[str]]:
    """`qbridge sync --once` over 12 NGinn rows in batches of 5, exporting its spans to
    `receiver` (with `otel`, more OTEL_* settings), which is stopped once it has run."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=5)
    assert b.cli("init") == 0
    b.insert(b.ready(12))
    env = without_otel(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, **otel)
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "--once", "-c", str(b.config)], cwd=tmp_path, check=False,
                       capture_output=True, text=True, env=env, timeout=120)
    receiver.stop()
    return b, r
