"""The trace context messages carry (issue 39's review): a legacy message's own `traceparent`
reaches NServiceBus only if its receive can parse it; a Spark unit's optimistic ledger conflict is
marked on its batch span; reverse jobs carry an arriving `traceparent` into OpenJMS (a JMS
String property) and BizTalk (the staging table's Headers JSON), and their batch spans link to it."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from bridge import tracing
from bridge.sources.nginn import NGinnSource
from helpers import Bridge
from tests.service.test_tracing import BAD, GOOD, dotnet_parses, spans  # noqa: F401 - spans: a pytest fixture
from tests.systems.test_reverse_biztalk import ToBizTalk, bts  # noqa: F401 - bts: a pytest fixture
from tests.systems.test_reverse_openjms import JmsTwoWay, jms2  # noqa: F401 - jms2: a pytest fixture

# Legacy headers NServiceBus's ActivityContext.TryParse refuses (and one made of nothing at all).
UNPARSABLE = [GOOD.upper(), "ff" + GOOD[2:], f"00-{'0' * 32}-b7ad6b7169203331-01", "garbage", GOOD[:-1]]


def _batch_spans(spans) -> dict[int, object]:  # noqa: F811 - the fixture's value
    return {s.context.span_id: s for s in spans.get_finished_spans() if s.name == "qbridge.batch"}


def _raw_headers(b: Bridge, table: str) -> list[str]:
    with b.target.connect() as conn:
        return [h for (h,) in conn.execute(sa.text(f'select headers from "{table}"'))]


def test_only_a_legacy_traceparent_nservicebus_can_parse_is_kept(tmp_path: Path, spans, monkeypatch) -> None:  # noqa: F811
    """Both lanes (a batch of 100 rows is the columnar lane's, batches of 5 the per-row lanes'):
    with trace_messages on, a message's own valid traceparent is kept (its sender's trace goes
    on); one NServiceBus could not parse is replaced by the batch's, never passed through."""
    monkeypatch.setattr(NGinnSource, "lane_min_rows", 64)  # NGinn's own threshold is more than 100 rows
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=200,
               extra="trace_messages = true\n")
    assert b.cli("init") == 0
    for size, start, count in ((200, 1, 100), (5, 500, 12)):
        rows = b.ready(count, start=start)
        for i, value in enumerate([GOOD, *UNPARSABLE]):
            rows[2 * i + 1]["msg_headers"] = f"Tenant=acme|traceparent={value}"
        b.batch_size = size
        b.write_config()
        b.insert(rows)
        assert b.cli("sync", "--once") == 0
    batches = _batch_spans(spans)
    got = b.rows("Orders")
    assert len(got) == 112
    for row in got:
        parent = row["headers"]["traceparent"]
        assert dotnet_parses(parent), parent
        assert row["headers"]["Acme.Tenant"] == "acme"  # the other headers stay as they were
        if parent != GOOD:
            assert int(parent.split("-")[2], 16) in batches  # the batch's own
    assert sum(1 for r in got if r["headers"]["traceparent"] == GOOD) == 2  # one per lane
    assert all(h.count('"traceparent"') == 1 for h in _raw_headers(b, "Orders"))  # replaced, not added twice
    assert b.cli("verify", "--deep") == 0
    b.dispose()


def test_the_columnar_lanes_patterns_agree_with_the_validator() -> None:
    """The columnar lane decides on header JSON with RE2 patterns (no look-ahead there); Python's
    re reads these the same way."""
    import re

    for value in [GOOD, "cc" + GOOD[2:], *BAD.values(), *UNPARSABLE, 'a "quoted" \\ value']:
        text = orjson.dumps({"Tenant": "acme", "traceparent": value, "Next": "x"}).decode()
        kept = re.search(tracing.TRACEPARENT_JSON_VALID, text) and not re.search(tracing.TRACEPARENT_JSON_ZEROS, text)
        assert bool(kept) == tracing.valid_traceparent(value) == dotnet_parses(value), value
        assert re.sub(tracing.TRACEPARENT_JSON_ANY, r'\1"traceparent":"X"', text) == '{"Tenant":"acme","traceparent":"X","Next":"x"}'


def test_a_units_optimistic_ledger_conflict_is_on_its_batch_span(tmp_path: Path, spans) -> None:  # noqa: F811
    """A Spark unit's first attempt inserts without looking the ledger up; rows delivered before
    collide, and the batch goes on with the lookup: its span records the conflict and a retry."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=5)
    assert b.cli("init") == 0
    ids = b.insert(b.ready(5))
    assert b.cli("sync", "--once") == 0
    spans.clear()
    result = b.runner().run_range("MQueue1", None, ids[-1])  # a unit in-process: a first attempt, optimistic
    assert (result.stats.delivered, result.stats.already) == (0, 5)
    [batch] = [s for s in spans.get_finished_spans() if s.name == "qbridge.batch" and s.attributes["qbridge.read"]]
    assert [e.attributes["exception.type"] for e in batch.events if e.name == "exception"] == ["bridge.pipeline.job.LedgerConflict"]
    assert batch.attributes["qbridge.retries"] == 1 and batch.attributes["qbridge.already"] == 5
    assert batch.status.status_code.name == "UNSET"  # the batch itself went through
    b.dispose()


def _links(batch) -> list[str]:
    return [f"00-{link.context.trace_id:032x}-{link.context.span_id:016x}-{int(link.context.trace_flags):02x}"
            for link in batch.links]


def _reverse_batch(spans, job: str):  # noqa: F811 - the fixture's value
    [batch] = [s for s in spans.get_finished_spans()
               if s.name == "qbridge.batch" and s.attributes.get("qbridge.job") == job and s.attributes.get("qbridge.read")]
    return batch


def _sender_parent() -> str:
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


@pytest.mark.postgres
@pytest.mark.mariadb
def test_a_reverse_job_carries_the_traceparent_into_an_openjms_property(jms2: JmsTwoWay, spans) -> None:  # noqa: F811
    ep, parent = jms2.endpoint, _sender_parent()
    ep.send(ep.address("replies"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send", traceparent=parent),
            b'{"ok":1}')
    assert jms2.cli("sync", "--once", "--job", "to-jms") == 0
    [got] = jms2.pending("replies")
    assert got["jms"].properties["traceparent"] == {"type": "java.lang.String", "value": parent}
    assert _links(_reverse_batch(spans, "to-jms")) == [parent]


@pytest.mark.postgres
def test_a_reverse_job_carries_the_traceparent_into_the_biztalk_staging_headers(bts: ToBizTalk, spans) -> None:  # noqa: F811
    ep, parent = bts.endpoint, _sender_parent()
    ep.send(ep.address("Invoicing"), ep.headers("Billing.Messages.InvoiceRequested, Billing.Messages", "Send",
                                                traceparent=parent), b"<InvoiceRequested/>")
    assert bts.cli("sync", "--once") == 0
    [row] = bts.poll("InvoiceIn")
    # The Headers column the receive location's PollingStatement returns; not a context property.
    assert orjson.loads(row["Headers"])["traceparent"] == parent
    assert _links(_reverse_batch(spans, "to-biztalk")) == [parent]
