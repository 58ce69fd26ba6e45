"""The conformance suite, run for NGinn on SQLite and PostgreSQL, into both target flavors."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson
import pytest
import sqlalchemy as sa

from bridge.demo.samples import DOTNET_ERROR, create_nginn_subscriptions, nginn_row
from bridge.timefmt import from_wire
from helpers import MAPPING, TZ, Bridge

BACKENDS = ["sqlite", "postgres", "postgres-sqlserver-flavor"]


@pytest.fixture(params=BACKENDS)
def bridge(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Bridge]:
    yield from make_bridge(request, tmp_path)


def make_bridge(request: pytest.FixtureRequest, tmp_path: Path, **kwargs: object) -> Iterator[Bridge]:
    if request.param == "sqlite":
        b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", **kwargs)
    else:
        schema = request.getfixturevalue("pg_schema")
        url = request.getfixturevalue("pg_server")
        flavor = "sqlserver" if request.param.endswith("sqlserver-flavor") else "postgresql"
        b = Bridge(tmp_path, url, url, source_schema=schema, target_schema=schema, flavor=flavor, **kwargs)
    assert b.cli("init") == 0
    yield b
    b.dispose()


def test_every_state_lands_where_the_mapping_says(bridge: Bridge) -> None:
    now = bridge.now_local()
    ready = nginn_row("MQueue1", 1, now, headers="_NG-ReplyTo=sql://db/Sender|Tenant=acme|_NG-Seq=7")
    due_local = now + timedelta(hours=2)
    delayed = nginn_row("MQueue1", 2, now, subqueue="R", retry_time=due_local)
    failed = nginn_row("MQueue1", 3, now, subqueue="F", error_info=DOTNET_ERROR)
    processed = nginn_row("MQueue1", 4, now, subqueue="X")
    ids = bridge.insert([ready, delayed, failed, processed])

    assert bridge.cli("sync", "--once") == 0

    [q] = bridge.rows("Orders")
    h = q["headers"]
    assert h["NServiceBus.EnclosedMessageTypes"] == "Orders.Messages.PlaceOrder, Orders.Messages"
    assert h["NServiceBus.ReplyToAddress"] == bridge.runner().tables.address("Sales")
    assert h["Acme.Tenant"] == "acme" and "Tenant" not in h
    assert not any(k.startswith("_NG-") for k in h)
    assert h["Acme.Origin"] == f"legacy MQueue1#{ids[0]}"
    assert h["NServiceBus.CorrelationId"] == "corr-1"
    assert h["NServiceBus.ContentType"] == "application/json"
    sent = from_wire(h["NServiceBus.TimeSent"])
    assert sent == now.replace(tzinfo=ZoneInfo(TZ))
    assert orjson.loads(bytes(q["body"]))["OrderId"] == 1

    [d] = bridge.rows("Orders.Delayed")
    expected_due = due_local.replace(tzinfo=ZoneInfo(TZ)).astimezone(UTC)
    assert as_utc(d["due"]) == expected_due

    [e] = bridge.rows("error")
    eh = e["headers"]
    assert eh["NServiceBus.FailedQ"] == bridge.runner().tables.address("Orders")
    assert eh["NServiceBus.ExceptionInfo.ExceptionType"] == "System.InvalidOperationException"
    assert eh["NServiceBus.ExceptionInfo.Message"] == "Order 42 cannot be shipped: no stock"
    assert eh["NServiceBus.ExceptionInfo.InnerExceptionType"] == "System.Data.SqlClient.SqlException"
    assert eh["NServiceBus.ExceptionInfo.StackTrace"] == DOTNET_ERROR
    from_wire(eh["NServiceBus.TimeOfFailure"])
    assert eh["NServiceBus.ProcessingEndpoint"] == "Orders" and eh["NServiceBus.ProcessingMachine"]

    assert bridge.ledger() == {"delivered": 3, "skipped": 1}
    assert bridge.subqueues() == {ids[0]: "I", ids[1]: "R", ids[2]: "F", ids[3]: "X"}  # copy mode: untouched


def test_rerun_and_consumer_deletes_never_duplicate(bridge: Bridge) -> None:
    bridge.insert(bridge.ready(30))
    assert bridge.cli("sync", "--once") == 0
    assert bridge.cli("sync", "--once") == 0
    assert bridge.count("Orders") == 30
    bridge.delete_all("Orders")  # the endpoint consumed them; the queue table alone can no longer de-duplicate
    bridge.write_config()
    assert bridge.cli("sync", "--once") == 0
    assert bridge.count("Orders") == 0
    bridge.insert(bridge.ready(5, start=31))
    assert bridge.cli("sync", "--once") == 0
    ids = bridge.message_ids("Orders")
    assert len(ids) == 5 and set(ids.values()) == {1}
    assert bridge.cli("verify") == 0


def test_small_batches_walk_the_whole_queue(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.param = "sqlite"
    for b in make_bridge(request, tmp_path, batch_size=7):
        b.insert(b.ready(50))
        assert b.cli("sync", "--once") == 0
        assert b.count("Orders") == 50
        assert set(b.message_ids("Orders").values()) == {1}


def test_malformed_rows_are_quarantined_and_the_rest_delivered(bridge: Bridge) -> None:
    now = bridge.now_local()
    rows = [
        nginn_row("MQueue1", 1, now),
        nginn_row("MQueue1", 2, now, headers="Filter=a=b"),  # a value containing '='
        nginn_row("MQueue1", 3, now, headers="JustAName"),  # a header without '='
        nginn_row("MQueue1", 4, now, body="{not json"),  # invalid JSON body
        nginn_row("MQueue1", 5, now, subqueue="Q"),  # an unknown subqueue letter
        {**nginn_row("MQueue1", 6, now), "msg_text": None},  # NULL body
        nginn_row("MQueue1", 7, now),
    ]
    ids = bridge.insert(rows)
    assert bridge.cli("sync", "--once") == 0
    assert bridge.count("Orders") == 2
    with bridge.target.connect() as conn:
        prefix = f'"{bridge.target_schema}".' if bridge.target_schema else ""
        reasons = dict(conn.execute(sa.text(f"select source_key, reason from {prefix}qbridge_quarantine")).all())
        raw = orjson.loads(conn.execute(sa.text(f"select raw from {prefix}qbridge_quarantine where source_key = :k"), {"k": str(ids[1])}).scalar_one())
    assert "more than one '='" in reasons[str(ids[1])]
    assert "has no '='" in reasons[str(ids[2])]
    assert "not valid JSON" in reasons[str(ids[3])]
    assert "subqueue 'Q'" in reasons[str(ids[4])]
    assert "NULL" in reasons[str(ids[5])]
    assert raw["msg_headers"] == "Filter=a=b" and raw["id"] == ids[1]  # nothing lost
    assert bridge.cli("verify") == 0
    assert bridge.ledger() == {"delivered": 2, "quarantined": 5}


def test_move_mode_consumes_like_nginn_and_delivers_once(tmp_path: Path, request: pytest.FixtureRequest, bridge_param: str) -> None:
    request.param = bridge_param
    for b in make_bridge(request, tmp_path, mode="move"):
        now = b.now_local()
        ids = b.insert(b.ready(10) + [nginn_row("MQueue1", 99, now, subqueue="X"), nginn_row("MQueue1", 98, now, headers="bad=a=b")])
        assert b.cli("sync", "--once") == 0
        assert b.count("Orders") == 10
        sub = b.subqueues()
        assert all(sub[i] == "X" for i in ids[:11])
        assert sub[ids[11]] == "I"  # quarantined rows stay where they are for the operator
        t = b.tables["MQueue1"]
        with b.source.connect() as conn:
            processed = conn.execute(sa.select(sa.func.count()).where(t.c.last_processed.is_not(None), t.c.id.in_(ids[:10]))).scalar_one()
        assert processed == 10
        assert b.cli("sync", "--once") == 0
        assert b.count("Orders") == 10
        assert b.cli("verify") == 0


@pytest.fixture(params=["sqlite", "postgres"])
def bridge_param(request: pytest.FixtureRequest) -> str:
    return request.param


def test_subscriptions_from_both_tables(bridge: Bridge) -> None:
    now = bridge.now_local()
    rows = {
        "NGMB_Subscriptions": [("sql://db/MQueue1", "sql://db/MQueue2", "Orders.PlaceOrder", None),
                               ("sql://db/MQueue1", "sql://db/Gone", "Orders.Old", now - timedelta(days=1))],
        "NGinnMessageBus_Subscriptions": [("sql://db/MQueue1", "sql://db/Sender", "Orders.OrderPlaced", now + timedelta(days=1)),
                                          ("sql://db/MQueue1", "sql://db/Unknown", "Orders.OrderPlaced", None)],
    }
    for name, subs in rows.items():
        t = create_nginn_subscriptions(bridge.source, name, bridge.source_schema)
        with bridge.source.begin() as conn:
            for pub, sub, typ, exp in subs:
                conn.execute(t.insert().values(publisher_endpoint=pub, subscriber_endpoint=sub, message_type=typ,
                                               created_date=now, expiration_date=exp))
    bridge.insert(bridge.ready(1))
    assert bridge.cli("sync", "--once") == 0
    assert bridge.cli("sync", "--once") == 0
    got = sorted((r["endpoint"], r["topic"]) for r in _subscriptions(bridge))
    assert got == [("Billing", "Orders.Messages.PlaceOrder"), ("Sales", "Orders.OrderPlaced")]


def as_utc(value: datetime | str) -> datetime:
    """A Due column as read back: aware (timestamptz), naive UTC (datetime), or SQLite text."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _subscriptions(bridge: Bridge) -> list[dict[str, str]]:
    with bridge.target.connect() as conn:
        prefix = f'"{bridge.target_schema}".' if bridge.target_schema else ""
        return [{k.lower(): v for k, v in r.items()} for r in conn.execute(sa.text(f'select * from {prefix}"SubscriptionRouting"')).mappings()]


def test_ttl_expiry_and_audit(tmp_path: Path, request: pytest.FixtureRequest, bridge_param: str) -> None:
    request.param = bridge_param
    mapping = MAPPING.replace('processed = "skip"', 'processed = "audit"')
    for b in make_bridge(request, tmp_path, mapping=mapping):
        now = b.now_local()
        fmt = "%Y-%m-%d %H:%M:%S"
        ids = b.insert([
            nginn_row("MQueue1", 1, now, headers="_NG-TTL=" + (now + timedelta(hours=1)).strftime(fmt)),
            nginn_row("MQueue1", 2, now - timedelta(hours=2), headers="_NG-TTL=" + (now - timedelta(hours=1)).strftime(fmt)),
            nginn_row("MQueue1", 3, now, subqueue="X"),
        ])
        assert b.cli("sync", "--once") == 0
        [q] = b.rows("Orders")
        assert q["headers"]["NGinn.BusMessageId"] == str(ids[0])
        assert q["headers"]["NServiceBus.TimeToBeReceived"] == "01:00:00"
        expected = (now + timedelta(hours=1)).replace(tzinfo=ZoneInfo(TZ)).astimezone(UTC)
        assert as_utc(q["expires"]) == expected
        [a] = b.rows("audit")
        assert a["headers"]["NGinn.BusMessageId"] == str(ids[2]) and a["headers"]["NServiceBus.ProcessingEndpoint"] == "Orders"
        assert b.ledger() == {"delivered": 2, "skipped": 1}  # the expired one, as NGinn would drop it
        assert b.cli("verify") == 0
