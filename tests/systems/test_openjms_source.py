"""OpenJMS as a source: PostgreSQL through psycopg and MariaDB through pyodbc, into PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.demo.samples import openjms_destination, openjms_message, openjms_store
from helpers import Bridge, kill_at, walk_slices

FIXTURES = Path(__file__).parents[1] / "fixtures" / "openjms"
MAPPING = """
[routes]
"orders" = "Orders"
"replies" = "Replies"
"billing-sub" = "Billing"
"audit-sub" = "AuditTrail"
"binary.in" = "Binary"
"*" = "Unrouted"

[types]
"Orders.PlaceOrder" = "Orders.Messages.PlaceOrder, Orders.Messages"
"prices.eu" = "Prices.PriceChanged, Prices"
"""
QUEUE_ID, TOPIC_ID, BINARY_ID = 1, 2, 3
SUBSCRIBERS = {"billing-sub": 201, "audit-sub": 202}


def blob(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


class Jms(Bridge):
    def store(self, fn) -> None:
        with self.source.begin() as conn:
            if self.source_schema:
                conn.execute(sa.text(f'SET search_path TO "{self.source_schema}"'))
            fn(conn, self.jms_tables)

    def seed(self) -> None:
        from bridge.schemas.openjms import tables

        self.jms_tables = tables(self.source_schema)

        def create(conn, t):
            openjms_store(conn)
            openjms_destination(conn, t, "orders", QUEUE_ID, True)
            openjms_destination(conn, t, "prices.eu", TOPIC_ID, False, SUBSCRIBERS)
            openjms_destination(conn, t, "binary.in", BINARY_ID, True)

        self.store(create)

    def queue_message(self, mid: str, fixture: str = "text_simple.bin", **kw) -> None:
        self.store(lambda c, t: openjms_message(c, t, mid, QUEUE_ID, blob(fixture), [QUEUE_ID * 100], **kw))

    def count_rows(self, table: str) -> int:
        with self.source.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(self.jms_tables[table])).scalar_one()


@pytest.fixture(params=["postgres", "mariadb"])
def jms(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str) -> Iterator[Jms]:
    yield from make_jms(request.param, request, tmp_path, pg_server, pg_schema)


def make_jms(kind: str, request, tmp_path: Path, pg_server: str, pg_schema: str, **kw) -> Iterator[Jms]:
    if kind == "postgres":
        src, schema = pg_server, pg_schema
    else:
        src, schema = request.getfixturevalue("mariadb_database"), None
    queues = kw.pop("queues", ["orders", "prices.eu", "binary.in"])
    j = Jms(tmp_path, src, pg_server, source_schema=schema, target_schema=pg_schema, system="openjms",
            queues=queues, mapping=MAPPING, **kw)
    j.seed()
    assert j.cli("init") == 0
    yield j
    j.dispose()


def test_each_handle_becomes_one_message_for_its_route(jms: Jms) -> None:
    jms.queue_message("ID:q-1")
    jms.store(lambda c, t: openjms_message(c, t, "ID:t-1", TOPIC_ID, blob("real0761_text_durable_topic_overflowed_expiration.bin"),
                                           list(SUBSCRIBERS.values()), delivered=1))
    jms.store(lambda c, t: openjms_message(c, t, "ID:t-orphan", TOPIC_ID, blob("text_simple.bin"), []))  # no handle left
    assert jms.cli("sync", "--once") == 0

    [order] = jms.rows("Orders")
    h = order["headers"]
    assert h["NServiceBus.EnclosedMessageTypes"] == "Orders.Messages.PlaceOrder, Orders.Messages"
    assert h["NServiceBus.CorrelationId"] == "order-12345"
    assert h["NServiceBus.ReplyToAddress"] == jms.runner().tables.address("Replies")
    assert h["NServiceBus.TimeSent"] == "2006-03-09 15:00:00:123000 Z"
    assert h["NServiceBus.ContentType"] == "text/plain; charset=utf-8"
    assert h["JMS.Property.quantity"] == "42" and h["JMS.Property.discount"] == "0.15" and h["JMS.Property.express"] == "true"
    assert json.loads(h["JMS.PropertyTypes"])["orderNumber"] == "java.lang.Long"
    assert h["JMS.Property.orderNumber"] == "9007199254740993"
    assert h["JMS.Redelivered"] == "false" and h["JMS.Priority"] == "4"
    assert order["expires"] is None
    assert bytes(order["body"]) == b"hello world"

    billing, audit = jms.rows("Billing"), jms.rows("AuditTrail")
    assert len(billing) == 1 and len(audit) == 1
    for row, sub in ((billing[0], "billing-sub"), (audit[0], "audit-sub")):
        assert row["headers"]["JMS.Subscription"] == sub and row["headers"]["JMS.Redelivered"] == "true"
        assert row["headers"]["NServiceBus.EnclosedMessageTypes"] == "Prices.PriceChanged, Prices"
        assert row["expires"] is None  # an overflowed negative JMSExpiration means never
    assert billing[0]["headers"]["NServiceBus.MessageId"] != audit[0]["headers"]["NServiceBus.MessageId"]
    assert jms.count("Unrouted") == 0
    assert jms.cli("verify") == 0


def test_bodies_keep_their_kind(jms: Jms) -> None:
    for i, name in enumerate(["map_msg.bin", "stream_msg.bin", "object_msg.bin", "bytes_msg.bin"]):
        jms.store(lambda c, t, i=i, name=name: openjms_message(c, t, f"ID:b-{i}", BINARY_ID, blob(name), [BINARY_ID * 100], accepted=i))
    assert jms.cli("sync", "--once") == 0
    rows = {r["headers"]["JMS.BodyKind"]: r for r in jms.rows("Binary")}
    m = rows["MapMessage"]
    assert m["headers"]["NServiceBus.ContentType"] == "application/json; jms-body=map"
    assert json.loads(bytes(m["body"]))["name"] == "Widget"
    assert json.loads(m["headers"]["JMS.BodyTypes"])["big"] == "java.lang.Long"
    s = rows["StreamMessage"]
    assert json.loads(bytes(s["body"]))[-1] == "end"
    o = rows["ObjectMessage"]
    assert bytes(o["body"]).startswith(b"\xac\xed\x00\x05") and o["headers"]["NServiceBus.ContentType"] == "application/x-java-serialized-object"
    assert rows["BytesMessage"]["headers"]["NServiceBus.ContentType"] == "application/octet-stream"


def test_expired_skipped_and_bad_rows_quarantined(jms: Jms) -> None:
    jms.store(lambda c, t: openjms_message(c, t, "ID:exp", TOPIC_ID, blob("expiring.bin"), [201], expiry=1141920011123))
    good = blob("text_simple.bin")
    jms.queue_message("ID:good", accepted=1)
    jms.store(lambda c, t: openjms_message(c, t, "ID:cut", QUEUE_ID, good[: len(good) // 2], [100], accepted=2))
    jms.store(lambda c, t: openjms_message(c, t, "ID:alien", QUEUE_ID, good.replace(b"TextMessageImpl", b"TextMessageImpX"), [100], accepted=3))
    jms.store(lambda c, t: openjms_message(c, t, "ID:gone", QUEUE_ID, good, [100], accepted=4, with_message_row=False))
    jms.queue_message("ID:good2", accepted=5)
    assert jms.cli("sync", "--once") == 0
    assert jms.count("Orders") == 2
    with jms.target.connect() as conn:
        reasons = dict(conn.execute(sa.text(f'select source_key, reason from "{jms.target_schema}".qbridge_quarantine')).all())
    assert "truncated" in reasons["ID:cut#100"]
    assert "unknown class" in reasons["ID:alien#100"] and "TextMessageImpX" in reasons["ID:alien#100"]
    assert "not in the messages table" in reasons["ID:gone#100"]
    assert jms.ledger() == {"delivered": 2, "quarantined": 3, "skipped": 1}
    assert jms.cli("verify") == 0


def test_rerun_and_consumer_deletes_never_duplicate(jms: Jms) -> None:
    for i in range(30):
        jms.queue_message(f"ID:m-{i}", accepted=i)
    assert jms.cli("sync", "--once") == 0 and jms.cli("sync", "--once") == 0
    jms.delete_all("Orders")
    assert jms.cli("sync", "--once") == 0
    assert jms.count("Orders") == 0
    jms.queue_message("ID:m-new", accepted=99)
    assert jms.cli("sync", "--once") == 0
    assert jms.count("Orders") == 1


def test_late_commit_is_delivered_once(jms: Jms) -> None:
    jms.queue_message("ID:first", accepted=1)
    slow = jms.source.connect()
    tx = slow.begin()
    if jms.source_schema:
        slow.execute(sa.text(f'SET search_path TO "{jms.source_schema}"'))
    openjms_message(slow, jms.jms_tables, "ID:late", QUEUE_ID, blob("text_simple.bin"), [100], accepted=0)
    jms.queue_message("ID:later", accepted=2)
    assert jms.cli("sync", "--once") == 0
    assert jms.count("Orders") == 2
    tx.commit()
    slow.close()
    assert jms.cli("sync", "--once") == 0
    ids = jms.message_ids("Orders")
    assert len(ids) == 3 and set(ids.values()) == {1}
    assert jms.cli("verify") == 0


def test_move_mode_deletes_handles_then_messages(request, tmp_path: Path, pg_server: str, pg_schema: str, jms_kind: str) -> None:
    for j in make_jms(jms_kind, request, tmp_path, pg_server, pg_schema, mode="move"):
        j.queue_message("ID:q", accepted=1)
        j.store(lambda c, t: openjms_message(c, t, "ID:t", TOPIC_ID, blob("text_simple.bin"), list(SUBSCRIBERS.values())))
        assert j.cli("sync", "--once") == 0
        assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
        assert j.count("Orders") == 1 and j.count("Billing") == 1 and j.count("AuditTrail") == 1
        assert j.cli("verify") == 0


@pytest.fixture(params=["postgres", "mariadb"])
def jms_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.slow
def test_sigkill_between_commits_in_move_mode(request, tmp_path: Path, pg_server: str, pg_schema: str, jms_kind: str) -> None:
    for j in make_jms(jms_kind, request, tmp_path, pg_server, pg_schema, mode="move", batch_size=10, queues=["orders"]):
        for i in range(25):
            j.queue_message(f"ID:k-{i}", accepted=i)
        kill_at(j, "after_target_commit", tmp_path)
        assert j.count("Orders") == 10 and j.count_rows("message_handles") == 25
        assert j.cli("sync", "--once") == 0
        ids = j.message_ids("Orders")
        assert len(ids) == 25 and set(ids.values()) == {1}
        assert j.count_rows("message_handles") == 0
        assert j.cli("verify") == 0


def test_durable_subscriptions_become_subscription_routing(jms: Jms) -> None:
    assert jms.cli("sync", "--once") == 0
    with jms.target.connect() as conn:
        rows = sorted(conn.execute(sa.text(f'select endpoint, topic, queueaddress from "{jms.target_schema}"."SubscriptionRouting"')).all())
    address = jms.runner().tables.address
    # NServiceBus topics are type names: the destination goes through [types] like a JMSType
    assert rows == [("AuditTrail", "Prices.PriceChanged", address("AuditTrail")), ("Billing", "Prices.PriceChanged", address("Billing"))]


def test_header_prefix_is_configurable(request, tmp_path: Path, pg_server: str, pg_schema: str) -> None:
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, queues=["orders"]):
        j.mapping = MAPPING + '\n[jms]\nheader_prefix = "Legacy.Jms."\n'
        j.write_config()
        j.queue_message("ID:p")
        assert j.cli("sync", "--once") == 0
        [row] = j.rows("Orders")
        assert row["headers"]["Legacy.Jms.Property.quantity"] == "42" and not any(k.startswith("JMS.") for k in row["headers"])


def test_handle_query_compiles_for_sql_server(tmp_path: Path) -> None:
    from sqlalchemy.dialects import mssql

    from bridge.schemas.openjms import tables

    t = tables("dbo")
    ddl = str(sa.schema.CreateTable(t["messages"]).compile(dialect=mssql.dialect()))
    assert "messageblob IMAGE" in ddl
    stmt = str(sa.select(t["message_handles"].c.messageid).where(t["message_handles"].c.consumerid == 1).compile(dialect=mssql.dialect()))
    assert "FROM dbo.message_handles" in stmt


def test_unknown_schema_version_is_refused(jms: Jms, capsys: pytest.CaptureFixture[str]) -> None:
    jms.store(lambda c, t: c.execute(t["system_data"].update().values(version="V0.7.2")))
    assert jms.cli("sync", "--once") == 2  # a schema qbridge does not read: waiting cannot fix it
    assert "OpenJMS schema version 'V0.7.2' is not supported" in " ".join(capsys.readouterr().err.split())


def test_slices_cover_every_handle_once_in_delivery_order(jms: Jms) -> None:
    """Spark's slices of a scan source: boundaries picked by the database, pages read by keyset
    (ties and NULL accept times included), every handle in exactly one slice."""
    for i in range(25):
        accepted = None if i < 3 else 1_141_916_400_000 + i // 4  # NULL times, and ties broken by later columns
        jms.store(lambda c, t, i=i, a=accepted: c.execute(t["message_handles"].insert().values(
            messageid=f"ID:s-{i:02d}", destinationid=QUEUE_ID, consumerid=QUEUE_ID * 100, priority=4,
            acceptedtime=a, sequencenumber=i % 2, expirytime=0, delivered=0)))
    source = jms.runner().sources["orders"]
    with jms.source.connect() as conn:
        everything = list(source.iter_slice(conn, None, None))
        assert sorted(everything) == sorted(source.iter_keys(conn))
        bounds = source.slice_boundaries(conn, 7)
        assert len(bounds) == 3 and source.count_keys(conn) == 25
        seen = walk_slices(source, conn, bounds, 4)
    assert seen == everything and len(set(seen)) == 25


def test_slice_comparison_compiles_for_sql_server() -> None:
    from sqlalchemy.dialects import mssql

    from bridge.sources.base import tuple_after

    t = sa.table("h", sa.column("a"), sa.column("b"), sa.column("c"))
    sql = str(tuple_after([t.c.a, t.c.b, t.c.c], (1, 2, 3), "mssql").compile(dialect=mssql.dialect(), compile_kwargs={"literal_binds": True}))
    assert sql == "h.a > 1 OR h.a = 1 AND h.b > 2 OR h.a = 1 AND h.b = 2 AND h.c > 3"


def test_consuming_one_subscribers_handle_keeps_the_message_for_the_other(jms: Jms) -> None:
    jms.store(lambda c, t: openjms_message(c, t, "ID:t-2", TOPIC_ID, blob("text_simple.bin"), list(SUBSCRIBERS.values())))
    r = jms.runner()
    with r.source_engine.connect() as conn:
        [topic] = [s for s in r.sources.values() if s._destination(conn) == (TOPIC_ID, False)]
        keys = sorted(topic.iter_keys(conn))
    assert len(keys) == 2
    messages = jms.count_rows("messages")
    with r.source_engine.begin() as conn:
        assert topic.consume(conn, [keys[0]]) == 1
    assert jms.count_rows("message_handles") == 1 and jms.count_rows("messages") == messages  # the other still holds it
    with r.source_engine.begin() as conn:
        assert topic.consume(conn, [keys[0]]) == 0  # idempotent
        assert topic.consume(conn, [keys[1]]) == 1
    assert jms.count_rows("message_handles") == 0 and jms.count_rows("messages") == messages - 1


@pytest.mark.parametrize("mode", ["copy", "move"])
def test_a_pass_takes_the_oldest_new_handles_first(request, tmp_path: Path, pg_server: str, pg_schema: str,
                                                   jms_kind: str, mode: str) -> None:
    """A pass walks handles by message id (the ledger's order, for sequential lookups) and still
    takes the oldest new handles as its batch, more than a batch's worth of them included."""
    for j in make_jms(jms_kind, request, tmp_path, pg_server, pg_schema, mode=mode, batch_size=3, queues=["orders"]):
        for i in range(8):  # message ids sort the other way round from their accept times
            j.queue_message(f"ID:m-{i}", accepted=1_141_916_400_000 + 1000 * (8 - i))
        runner = j.runner()
        source = runner.sources["orders"]
        with j.source.connect() as conn:
            assert [k for k, _ in source.iter_aged(conn)] == [f"ID:m-{i}#100" for i in range(8)]
            assert [k for k, _ in source.iter_aged(conn, (100, "ID:m-2"))] == [f"ID:m-{i}#100" for i in range(3, 8)]
        taken = []
        for expected in ([7, 6, 5], [4, 3, 2], [1, 0]):
            stats = runner.run_pass("orders")
            assert stats.delivered == len(expected) and stats.more == (len(expected) == 3)
            with j.target.connect() as conn:
                known = runner.ledger_lookup(conn, source, [f"ID:m-{i}#100" for i in range(8)])
            new = sorted(set(known) - set(taken))
            assert new == sorted(f"ID:m-{i}#100" for i in expected)
            taken += new
        assert j.count("Orders") == 8 and j.cli("verify") == 0


def test_a_batch_of_topic_handles_reads_each_handle_once(jms: Jms) -> None:
    """Chunks of 500 (consumer, message) pairs are looked up by a consumer list and a message list,
    which match other chunks' pairs too: each handle is still taken once (the read count feeds
    the throttle)."""
    jms.store(lambda c, t: [openjms_message(c, t, f"ID:b-{i:03d}", TOPIC_ID, blob("text_simple.bin"), list(SUBSCRIBERS.values()))
                            for i in range(350)])
    source = jms.runner().sources["prices.eu"]
    with jms.source.connect() as conn:
        keys = list(source.iter_keys(conn))
        rows = source.fetch_keys(conn, keys, False)
    assert len(keys) == 700 and [r.key for r in rows] == keys


@pytest.mark.parametrize("kind", ["postgres", "mariadb"])
def test_a_keyset_page_reads_its_own_handles_not_the_rest_of_the_destination(request, tmp_path: Path, pg_server: str,
                                                                             pg_schema: str, kind: str) -> None:
    """issue 49, the fall from 200k to 2M handles: the keyset joined the destination by name, so
    PostgreSQL could not see that its index's order was the page's, and read every handle after
    the page's start (and sorted them) for each page: O(handles) a page, 980 ms a page at 2M
    (bench/scan_plans.py). MariaDB read them too, answering the row comparison `(c, m) > (x, y)`
    by the index's first column alone. The page's index scan must stop at the page."""
    for j in make_jms(kind, request, tmp_path, pg_server, pg_schema, queues=["orders"]):
        j.store(lambda c, t: c.execute(t["message_handles"].insert(), [
            {"messageid": f"ID:k-{i:05d}", "destinationid": QUEUE_ID, "consumerid": QUEUE_ID * 100, "priority": 4,
             "acceptedtime": 1_141_916_400_000 + i, "sequencenumber": i, "expirytime": 0, "delivered": 0}
            for i in range(5000)]))
        j.store(lambda c, t: c.execute(sa.text("ANALYZE message_handles" if kind == "postgres" else
                                               "ANALYZE TABLE message_handles")))
        source = j.runner().sources["orders"]
        with j.source.connect() as conn:
            if kind == "postgres":
                conn.execute(sa.text(f'SET search_path TO "{pg_schema}"'))
            _, after = source.slice_page(conn, None, None, 2500)  # a page from the middle
            sql = source._slice(after, None, conn.dialect.name).limit(100).compile(
                dialect=conn.dialect, compile_kwargs={"literal_binds": True})
            explain = "EXPLAIN (ANALYZE, FORMAT JSON)" if kind == "postgres" else "ANALYZE FORMAT=JSON"
            plan = conn.exec_driver_sql(f"{explain} {sql}").scalar()
        plan = plan if isinstance(plan, (list, dict)) else json.loads(plan)

        def handles_read(node: object) -> float:
            """Rows the plan read from message_handles (PostgreSQL's Actual Rows, MariaDB's r_rows)."""
            if isinstance(node, list):
                return sum(handles_read(n) for n in node)
            if not isinstance(node, dict):
                return 0
            own = 0.0
            if node.get("Relation Name") == "message_handles":
                own = node.get("Actual Rows", 0)
            elif node.get("table_name") == "message_handles":
                own = node.get("r_rows", 0)
            return own + sum(handles_read(v) for v in node.values())

        assert 0 < handles_read(plan) <= 101, json.dumps(plan, indent=1)
