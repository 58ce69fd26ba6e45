"""How tracing is switched on (issue 39's review): the standard OTEL_* values, a clear error for
one qbridge cannot honour, a start-up that is safe on many threads and never degrades to no spans
after a failure, OTLP over gRPC to a real receiver, the exporter settings handed to Spark's
executors, and a whole command that imports nothing of OpenTelemetry when tracing is off."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge import tracing
from bridge.errors import ConfigError, DriverMissing
from helpers import Bridge
from receivers import GrpcReceiver, sync_exporting, without_otel

OTEL = [n for n in os.environ if n.startswith("OTEL_")]


@pytest.fixture()
def env(monkeypatch):
    """No OTEL_* variable but the test's own; tracing starts afresh before and after."""
    for name in OTEL:
        monkeypatch.delenv(name)
    tracing.reset()
    yield monkeypatch
    tracing.reset()


@pytest.mark.parametrize("value", ["none", "NONE", " None "])
def test_none_turns_tracing_off_even_with_an_endpoint(env, value: str) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.configured()
    env.setenv("OTEL_TRACES_EXPORTER", value)
    assert not tracing.configured()


@pytest.mark.parametrize("value", ["otlp", "OTLP", "console", "otlp,console", "Console , OTLP"])
def test_the_exporters_qbridge_has_turn_tracing_on(env, value: str) -> None:
    assert not tracing.configured()
    env.setenv("OTEL_TRACES_EXPORTER", value)
    assert tracing.configured()


@pytest.mark.parametrize("value", ["zipkin", "jaeger", "logging", "otlp,zipkin", "none,otlp", "otlp/stdout"])
def test_an_exporter_qbridge_has_not_is_a_clear_error(env, value: str) -> None:
    env.setenv("OTEL_TRACES_EXPORTER", value)
    with pytest.raises(ConfigError) as e:
        tracing.configured()
    assert str(e.value).startswith(f"OTEL_TRACES_EXPORTER: {value!r}: ")
    assert "otlp or console" in str(e.value) and "none" in str(e.value)


def test_a_disabled_sdk_looks_at_nothing_else(env) -> None:
    env.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    env.setenv("OTEL_SDK_DISABLED", "TRUE")
    assert not tracing.configured()


@pytest.mark.parametrize("value, protocol", [("grpc", "grpc"), ("GRPC", "grpc"), (" gRPC ", "grpc"),
                                             ("HTTP/Protobuf", "http/protobuf"), ("", "http/protobuf")])
def test_the_protocol_is_read_in_any_case(env, value: str, protocol: str) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", value)
    assert tracing.configured() and tracing._protocol() == protocol


def test_the_traces_protocol_wins_over_the_general_one(env) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    env.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert tracing.configured() and tracing._protocol() == "grpc"


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
def test_http_json_and_unknown_protocols_are_refused_clearly(env, name: str) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    env.setenv(name, "http/json")
    with pytest.raises(ConfigError, match=f"^{name}: 'http/json': the OpenTelemetry Python SDK has no OTLP/HTTP JSON"):
        tracing.configured()
    env.setenv(name, "thrift")
    with pytest.raises(ConfigError, match=f"^{name}: 'thrift': qbridge sends OTLP as http/protobuf or grpc"):
        tracing.configured()


def test_a_bad_value_stops_the_command_before_anything_moves(tmp_path: Path, env, capsys) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.insert(b.ready(3))
    env.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    assert b.cli("sync", "--once") == 2
    assert "config error: OTEL_TRACES_EXPORTER: 'zipkin'" in capsys.readouterr().err
    assert b.count("Orders") == 0
    b.dispose()


def _in_memory():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_threads_starting_spans_at_once_are_all_traced(env) -> None:
    """`qbridge run`'s jobs start on APScheduler's threads together: the provider is built once,
    and no thread's spans are lost while it is being built (a slow start widens the window)."""
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    provider, exporter = _in_memory()
    built = []

    def slow_provider():
        built.append(1)
        time.sleep(0.3)
        return provider

    env.setattr(tracing, "_provider", slow_provider)
    n = 8
    gate = threading.Barrier(n)

    def job(i: int) -> None:
        gate.wait()
        with tracing.span("qbridge.batch", job=f"job{i}"):
            pass

    threads = [threading.Thread(target=job, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(built) == 1
    assert sorted(s.attributes["qbridge.job"] for s in exporter.get_finished_spans()) == sorted(f"job{i}" for i in range(n))


def test_a_failed_start_fails_every_span_until_it_is_fixed(env) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    provider, exporter = _in_memory()
    broken = [True]

    def start():
        if broken[0]:
            raise DriverMissing("no exporter")
        return provider

    env.setattr(tracing, "_provider", start)
    for _ in range(3):  # never a silent span without a trace
        with pytest.raises(DriverMissing), tracing.span("qbridge.batch"):
            pass
    broken[0] = False
    with tracing.span("qbridge.batch"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["qbridge.batch"]


def test_grpc_without_its_exporter_says_what_to_install(env) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    env.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)  # as if not installed
    for _ in range(2):
        with pytest.raises(DriverMissing, match="pip install opentelemetry-exporter-otlp-proto-grpc"), \
                tracing.span("qbridge.batch"):
            pass


@pytest.mark.slow
def test_sync_exports_its_spans_to_a_real_otlp_grpc_receiver(tmp_path: Path) -> None:
    receiver = GrpcReceiver()
    b, r = sync_exporting(tmp_path, receiver, OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_SERVICE_NAME="qbridge-grpc")
    assert r.returncode == 0, r.stderr
    names = [s.name for _, s in receiver.spans]
    assert names.count("qbridge.batch") == 3 and names.count("qbridge.drain") == 1
    assert {service for service, _ in receiver.spans} == {"qbridge-grpc"}
    ids = {s.span_id.hex() for _, s in receiver.spans if s.name == "qbridge.batch"}
    assert {row["headers"]["traceparent"].split("-")[2] for row in b.rows("Orders")} == ids
    b.dispose()


def test_spark_executors_get_the_exporter_settings(monkeypatch) -> None:
    """On a cluster the executors' Python workers do not inherit the driver's environment: the
    SparkConf that spark_context builds hands them every OTEL_* variable (and the fault points),
    and redacts the OTLP headers (a collector's credentials) from the Spark UI."""
    import re

    from pyspark import SparkContext

    from bridge.pipeline import spark_context as sc

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "qbridge-eu")
    monkeypatch.setenv("QBRIDGE_FAULT_PAUSE", "nowhere")
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):  # spark_context sets them if unset
        monkeypatch.setenv(name, os.environ.get(name, sys.executable))
    monkeypatch.setattr(sc, "_launches_jvm", lambda: False)  # no JVM: only the conf is looked at
    monkeypatch.setattr(sc, "_quiet_gateway", lambda conf: None)
    monkeypatch.setattr(SparkContext, "getOrCreate", classmethod(lambda cls, conf: conf))
    conf = sc.spark_context("local[2]")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_SERVICE_NAME", "QBRIDGE_FAULT_PAUSE"):
        assert conf.get(f"spark.executorEnv.{name}") == os.environ[name]
    assert conf.get("spark.executorEnv.PATH") is None
    redact = re.compile(conf.get("spark.redaction.regex"))
    assert redact.search("spark.executorEnv.OTEL_EXPORTER_OTLP_HEADERS") and redact.search("spark.some.password")
    assert not redact.search("spark.executorEnv.OTEL_SERVICE_NAME")


def test_a_whole_sync_without_an_exporter_never_loads_opentelemetry(tmp_path: Path) -> None:
    """Off costs nothing: `qbridge sync --once` moves rows (both lanes) in a Python that then
    holds no OpenTelemetry module."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=200)
    assert b.cli("init") == 0
    b.insert(b.ready(120))
    code = ("import sys\nfrom bridge.commands.main import main\n"
            # 120 rows: the lane as it was taken before each source had its own threshold
            "from bridge.sources.nginn import NGinnSource\nNGinnSource.lane_min_rows = 64\n"
            f"rc = main(['sync', '--once', '-c', {str(b.config)!r}])\n"
            "assert rc == 0, rc\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
            "assert not loaded, loaded\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=False, capture_output=True, text=True,
                       env=without_otel(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert b.count("Orders") == 120
    b.dispose()


def test_the_console_exporter_keeps_stdout_for_json(tmp_path) -> None:
    """`OTEL_TRACES_EXPORTER=console` prints spans on stderr: stdout carries a command's --json document."""
    import json
    import os
    import subprocess
    import sys

    from helpers import Bridge

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    r = subprocess.run([sys.executable, "-m", "bridge", "quarantine", "replay", "--all", "--json", "-c", str(b.config)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "qbridge-test"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"] == []
    assert '"name": "qbridge.quarantine.replay"' in r.stderr, r.stderr
    b.dispose()
