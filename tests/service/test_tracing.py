"""OpenTelemetry spans (issue 39): a drain and each batch, with their numbers, to an in-memory
exporter; nothing of OpenTelemetry loaded when no exporter is configured; log lines carry the
trace and span ids of the span they were written under."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import tracing
from bridge.sources.nginn import NGinnSource
from helpers import Bridge
from receivers import OtlpReceiver, sync_exporting, without_otel
from tests.systems.test_reverse_nginn import TwoWay  # noqa: F401 - the two_way fixture's class
from tests.systems.test_reverse_nginn import two_way  # noqa: F401 - a pytest fixture


@pytest.fixture()
def spans():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.reset()


def test_a_sync_traces_its_drain_and_each_batch(tmp_path: Path, spans) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    rows = b.ready(10)
    rows[3]["msg_text"] = "{not json"
    b.insert(rows)
    assert b.cli("sync", "--once") == 0
    done = spans.get_finished_spans()
    drains = [s for s in done if s.name == "qbridge.drain"]
    batches = [s for s in done if s.name == "qbridge.batch"]
    assert len(drains) == 1 and len(batches) == 3  # 4 + 4 + 2 rows
    [drain] = drains
    assert drain.attributes["qbridge.job"] == "job1" and drain.attributes["qbridge.queue"] == "MQueue1"
    assert drain.attributes["qbridge.read"] == 10 and drain.attributes["qbridge.delivered"] == 9
    assert drain.attributes["qbridge.quarantined"] == 1
    for s in batches:  # children of the drain, in its trace
        assert s.parent is not None and s.parent.span_id == drain.context.span_id
        assert s.context.trace_id == drain.context.trace_id
    assert sum(s.attributes["qbridge.delivered"] for s in batches) == 9
    b.dispose()


def test_a_log_line_under_a_span_carries_its_ids(spans) -> None:
    from bridge.pipeline.logcontext import JsonFormatter

    with tracing.span("qbridge.batch", job="j") as s:
        record = logging.LogRecord("qbridge.batch", logging.INFO, __file__, 1, "job=j queue=q rows=1", (), None)
        line = json.loads(JsonFormatter().format(record))
        assert tracing.traceparent() == f"00-{line['trace_id']}-{line['span_id']}-01"
    assert line["trace_id"] == f"{s.get_span_context().trace_id:032x}"


def dotnet_parses(value: str) -> bool:
    """What NServiceBus's receive accepts as its parent, written here from the rules and not from
    qbridge's code: .NET's ActivityContext.TryParse (Activity.TryConvertIdToContext: exactly 55
    characters, a version of two lowercase hex digits other than ff, then lowercase hex trace id
    [3:35] and parent id [36:52], neither all zeros, and two lowercase hex flag digits at 53 and
    54) and W3C trace context level 1's dashes at 2, 35 and 52, which .NET does not check."""
    lower_hex = "0123456789abcdef"
    if len(value) != 55 or any(value[i] != "-" for i in (2, 35, 52)):
        return False
    version, trace_id, parent_id, flags = value[0:2], value[3:35], value[36:52], value[53:55]
    if any(c not in lower_hex for c in version + flags) or version == "ff":
        return False
    return all(all(c in lower_hex for c in part) and part.strip("0") for part in (trace_id, parent_id))


GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BAD = {
    "uppercase trace id": GOOD.replace("0af7651916cd43dd", "0AF7651916CD43DD"),
    "uppercase flags": GOOD[:-2] + "0A",
    "version ff": "ff" + GOOD[2:],
    "uppercase version": "0A" + GOOD[2:],
    "trace id all zeros": f"00-{'0' * 32}-b7ad6b7169203331-01",
    "parent id all zeros": f"00-0af7651916cd43dd8448eb211c80319c-{'0' * 16}-01",
    "too short": GOOD[:-1],
    "too long (version 00 is exactly 55)": GOOD + "-00",
    "underscores for dashes": GOOD.replace("-", "_"),
    "dash moved": "00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",
    "not hex": GOOD.replace("b7ad", "b7az"),
    "empty": "",
}


def test_the_traceparent_is_what_nservicebus_parses(spans) -> None:
    """Negative cases against the validator (so that it can fail), positive ones against what
    qbridge writes; tracing.valid_traceparent, which decides whether a message's own header is
    kept, agrees with it on every case."""
    for why, value in BAD.items():
        assert not dotnet_parses(value), why
        assert not tracing.valid_traceparent(value), why
    assert dotnet_parses(GOOD) and tracing.valid_traceparent(GOOD)
    assert dotnet_parses("cc" + GOOD[2:]) and tracing.valid_traceparent("cc" + GOOD[2:])  # a later version, same length
    written = []
    for _ in range(50):
        with tracing.span("qbridge.batch"):
            written.append(tracing.traceparent())
    assert all(p is not None and dotnet_parses(p) for p in written), written
    assert len(set(written)) == 50
    assert tracing.traceparent() is None  # no span is current outside


def test_without_an_exporter_opentelemetry_is_never_loaded(tmp_path: Path) -> None:
    code = ("import sys\nfrom bridge import tracing\n"
            "with tracing.span('qbridge.batch', job='j') as s:\n    s.set_attribute('x', 1)\n"
            "assert tracing.traceparent() is None\n"
            "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'loaded'\n")
    env = without_otel()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    env["OTEL_TRACES_EXPORTER"] = "none"
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr


def _batch_spans(spans) -> dict[int, object]:
    return {s.context.span_id: s for s in spans.get_finished_spans() if s.name == "qbridge.batch"}


def test_each_message_carries_the_traceparent_of_the_batch_that_wrote_it(tmp_path: Path, spans, monkeypatch) -> None:
    """Both lanes: a batch of 100 rows (the columnar lane's) and batches of 5 (the per-row
    lanes'); a legacy message with a traceparent of its own keeps it."""
    monkeypatch.setattr(NGinnSource, "lane_min_rows", 64)  # NGinn's own threshold is more than 100 rows
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=200,
               extra="trace_messages = true\n")
    assert b.cli("init") == 0
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    rows = b.ready(100)
    rows[5]["msg_headers"] = f"Tenant=acme|traceparent={own}"
    b.insert(rows)
    assert b.cli("sync", "--once") == 0
    b.batch_size = 5
    b.write_config()
    b.insert(b.ready(12, start=500))
    assert b.cli("sync", "--once") == 0
    batches = _batch_spans(spans)
    seen_batches = set()
    for row in b.rows("Orders"):
        parent = row["headers"]["traceparent"]
        if parent == own:
            continue
        _, trace_id, span_id, flags = parent.split("-")
        span = batches[int(span_id, 16)]
        assert f"{span.context.trace_id:032x}" == trace_id and flags == "01"
        seen_batches.add(span.context.span_id)
    assert sum(1 for r in b.rows("Orders") if r["headers"]["traceparent"] == own) == 1
    assert len(seen_batches) == 1 + 3  # the lane's batch, then 5 + 5 + 2
    assert b.cli("verify", "--deep") == 0
    b.dispose()


def test_trace_messages_false_keeps_headers_as_they_were(tmp_path: Path, spans, monkeypatch) -> None:
    # An exporter configured the standard way, so that trace_messages' default would be on: the
    # spans themselves still go to the in-memory exporter (tracing.use), nothing is sent.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.configured()
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", extra="trace_messages = false\n")
    assert b.cli("init") == 0
    b.insert(b.ready(3))
    assert b.cli("sync", "--once") == 0
    assert all("traceparent" not in r["headers"] for r in b.rows("Orders"))
    assert _batch_spans(spans)  # spans all the same
    b.dispose()


@pytest.mark.postgres
def test_a_trace_goes_nginn_to_nservicebus_and_back_to_nginn(two_way, spans) -> None:
    """The request's traceparent is the forward batch's span; the endpoint's reply carries the
    same trace; the reverse job writes it into the NGinn row's headers, and its batch span links
    to the reply's span."""

    from bridge.demo.samples import nginn_row

    tw = two_way()
    (tw.tmp / "bridge.toml").write_text((tw.tmp / "bridge.toml").read_text().replace('mode = "move"', 'mode = "move"\ntrace_messages = true'))
    with tw.engine.begin() as conn:
        conn.execute(tw.orders.insert().values(nginn_row("Orders", 7, tw.now_local(), headers="_NG-ReplyTo=sql://db/Sender")))
    assert tw.cli("sync", "--once", "--job", "from-legacy") == 0
    request, _ = tw.endpoint.receive()
    forward = _batch_spans(spans)
    _, trace_id, span_id, _ = request["traceparent"].split("-")
    assert int(span_id, 16) in forward
    reply = tw.endpoint.reply(request, "Orders.Messages.OrderAccepted, Orders.Messages", b'{"OrderId":7}')
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    got = tw.nginn_receive(tw.sender)
    assert got["headers"]["traceparent"] == reply["traceparent"]  # NGinn's row keeps the trace
    reverse = [s for s in _batch_spans(spans).values() if s.attributes.get("qbridge.job") == "to-legacy"
               and s.attributes.get("qbridge.read")]
    [batch] = reverse
    assert [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in batch.links] == \
        [(trace_id, reply["traceparent"].split("-")[2])]
    assert tw.cli("verify") == 0


def test_sync_exports_its_spans_to_a_real_otlp_http_receiver(tmp_path: Path) -> None:
    receiver = OtlpReceiver()
    b, r = sync_exporting(tmp_path, receiver, OTEL_SERVICE_NAME="qbridge-test")
    assert r.returncode == 0, r.stderr
    names = [s.name for _, s in receiver.spans]
    assert names.count("qbridge.batch") == 3 and names.count("qbridge.drain") == 1
    assert {service for service, _ in receiver.spans} == {"qbridge-test"}
    batch = next(s for _, s in receiver.spans if s.name == "qbridge.batch")
    attrs = {a.key: (a.value.string_value or a.value.int_value) for a in batch.attributes}
    assert attrs["qbridge.job"] == "job1" and attrs["qbridge.queue"] == "MQueue1" and attrs["qbridge.delivered"] == 5
    # on by default once tracing is: each message names the batch span that wrote it
    ids = {s.span_id.hex() for _, s in receiver.spans if s.name == "qbridge.batch"}
    assert {row["headers"]["traceparent"].split("-")[2] for row in b.rows("Orders")} == ids
    b.dispose()


def test_rollback_and_quarantine_replay_are_traced(tmp_path: Path, spans) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    rows = b.ready(4)
    rows[1]["msg_text"] = "{not json"
    b.insert(rows)
    assert b.cli("sync", "--once") == 0
    assert b.cli("quarantine", "replay", "--all") == 1  # it fails again: the row is still not JSON
    assert b.cli("rollback", "--yes", "--job", "job1") == 0
    done = {s.name: s for s in spans.get_finished_spans()}
    replay = done["qbridge.quarantine.replay"]
    assert replay.attributes["qbridge.messages"] == 1 and replay.attributes["qbridge.failed_again"] == 1
    assert done["qbridge.rollback"].attributes["qbridge.job"] == "job1"
    b.dispose()


def fail_pass_once(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """The `nth` pass of the process fails once with a ledger conflict (another process wrote the
    same messages); with_backoff retries the drain at once."""
    from bridge.pipeline.job import LedgerConflict
    from bridge.pipeline.passes import Passes

    real, calls = Passes._pass, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == nth:
            raise LedgerConflict("another qbridge process delivered messages of 'MQueue1' at the same time")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Passes, "_pass", failing)
    monkeypatch.setattr("bridge.retry.BLIP", 0.01)


def test_a_ledger_conflict_is_on_the_failed_batch_span_and_the_retry_counts_it(tmp_path: Path, spans, monkeypatch) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.insert(b.ready(3))
    fail_pass_once(monkeypatch, 1)
    assert b.cli("sync", "--once") == 0
    batches = [s for s in spans.get_finished_spans() if s.name == "qbridge.batch"]
    first, second = batches[0], batches[1]
    assert first.status.status_code.name == "ERROR"
    assert [e.attributes["exception.type"] for e in first.events if e.name == "exception"] == ["bridge.pipeline.job.LedgerConflict"]
    assert second.attributes["qbridge.retries"] == 1 and second.attributes["qbridge.delivered"] == 3
    b.dispose()


def test_only_the_batch_after_a_failure_counts_a_retry(tmp_path: Path, spans, monkeypatch) -> None:
    """The drain is retried as a whole (with_backoff): the batch that failed is tried again with
    retries=1, and the batches after it, first attempts, carry no retries."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=2)
    assert b.cli("init") == 0
    b.insert(b.ready(7))
    fail_pass_once(monkeypatch, 2)
    assert b.cli("sync", "--once") == 0
    batches = [s for s in spans.get_finished_spans() if s.name == "qbridge.batch"]
    assert [s.status.status_code.name for s in batches] == ["UNSET", "ERROR", "UNSET", "UNSET", "UNSET"]
    assert [s.attributes.get("qbridge.retries") for s in batches] == [None, None, 1, None, None]
    assert [s.attributes.get("qbridge.delivered") for s in batches] == [2, None, 2, 2, 1]
    b.dispose()


@pytest.mark.postgres
@pytest.mark.slow
def test_migrate_traces_its_spark_tasks_under_its_own_span(make) -> None:
    """The driver's `qbridge.migrate` span is the parent of every task's `qbridge.unit` span,
    across processes (the task is handed the driver's traceparent), and of the closing drain."""
    receiver = OtlpReceiver()
    b = make(batch_size=50)
    b.insert(b.ready(200))
    r = subprocess.run([sys.executable, "-m", "bridge", "migrate", "-c", str(b.config), "--master", "local[2]",
                        "--unit-rows", "100"], cwd=b.tmp, capture_output=True, text=True, timeout=300,
                       env=without_otel(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url))
    assert r.returncode == 0, r.stderr
    receiver.stop()
    [driver] = [s for _, s in receiver.spans if s.name == "qbridge.migrate"]
    units = [s for _, s in receiver.spans if s.name == "qbridge.unit"]
    assert len(units) == 2
    assert all(u.trace_id == driver.trace_id and u.parent_span_id == driver.span_id for u in units)
    drains = [s for _, s in receiver.spans if s.name == "qbridge.drain"]
    assert drains and all(d.parent_span_id == driver.span_id for d in drains)
    batches = [s for _, s in receiver.spans if s.name == "qbridge.batch" and s.parent_span_id in {u.span_id for u in units}]
    delivered = sum(a.value.int_value for s in batches for a in s.attributes if a.key == "qbridge.delivered")
    assert delivered == 200  # 2 units of 100 rows in batches of 50 (and an empty one that finds the end)


def test_qbridge_runs_first_batch_after_failed_runs_counts_them(tmp_path: Path, spans) -> None:
    import threading

    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    from bridge.service.scheduler import JobWorker

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    b.insert(b.ready(10))
    good = load_config(b.config)
    b.source_url = "postgresql+psycopg://qbridge:secret@127.0.0.1:1/legacy"  # refuses connections
    b.write_config()
    bad = load_config(b.config)
    now = [0.0]
    worker = JobWorker(JobRunner(bad, bad.jobs[0]), threading.Event(), clock=lambda: now[0])
    for t in (0.0, 1.5):  # two failed runs, the second after the first's back-off
        now[0] = t
        worker.tick()
    assert worker.failures == 2
    worker.pending = JobRunner(good, good.jobs[0])  # as a reload with the database back would
    now[0] = 10.0
    worker.tick()
    assert worker.failures == 0 and b.count("Orders") == 10
    batches = [s for s in spans.get_finished_spans() if s.name == "qbridge.batch"]
    assert [s.attributes.get("qbridge.retries") for s in batches] == [2, None, None]
    worker.lock.release()
    b.dispose()
