"""Reverse jobs, NServiceBus -> OpenJMS on MariaDB: a JMS request answered by a migrated
NServiceBus endpoint arrives as an OpenJMS reply that OpenJMS's own readExternal reads; a
publish reaches a durable subscriber; crashes between the two commits double nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from bridge.commands.main import main as cli_main
from bridge.codecs.openjms_blob import decode
from bridge.demo.samples import openjms_destination, openjms_message, openjms_store
from helpers import kill_at
from nsb_endpoint import Endpoint

FIXTURES = Path(__file__).parents[1] / "fixtures" / "openjms"
FORWARD = """
[routes]
"orders" = "Orders"
"""
REVERSE = """
[routes]
"replies" = "replies"
"PriceFeed" = "prices.eu"
[types]
"Orders.OrderAccepted" = "Orders.Messages.OrderAccepted, Orders.Messages"
"prices.eu" = "Prices.PriceChanged, Prices"
"""


class JmsTwoWay:
    def __init__(self, tmp: Path, pg: str, nsb_schema: str, mariadb: str) -> None:
        self.tmp, self.pg, self.nsb_schema, self.mariadb = tmp, pg, nsb_schema, mariadb
        self.legacy = sa.create_engine(mariadb)
        with self.legacy.begin() as conn:
            self.t = openjms_store(conn)
            openjms_destination(conn, self.t, "orders", 1, True)
            openjms_destination(conn, self.t, "replies", 2, True)
            openjms_destination(conn, self.t, "prices.eu", 3, False, {"billing-sub": 301, "archive-sub": 302})
        (tmp / "forward.toml").write_text(FORWARD)
        (tmp / "reverse.toml").write_text(REVERSE)
        self.config = tmp / "bridge.toml"
        self.config.write_text(f"""
[connections]
jms = "{mariadb}"
nsb = "{pg}"

[[jobs]]
name   = "from-jms"
source = {{ system = "openjms", connection = "jms", queues = ["orders"], database = "jms" }}
target = {{ connection = "nsb", flavor = "postgresql", schema = "{nsb_schema}" }}
mapping = "forward.toml"
mode = "move"

[[jobs]]
name   = "to-jms"
source = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{nsb_schema}", queues = ["replies", "PriceFeed"] }}
target = {{ system = "openjms", connection = "jms", database = "jms" }}
mapping = "reverse.toml"
batch_size = 4
""")
        self.nsb = sa.create_engine(pg)
        self.endpoint = Endpoint(self.nsb, nsb_schema, "Orders")

    def cli(self, *args: str) -> int:
        return cli_main([args[0], "-c", str(self.config), *args[1:]])

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "bridge", args[0], "-c", str(self.config), *args[1:], "--job", "to-jms"]
        return subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def pending(self, destination: str) -> list[dict]:
        """What OpenJMS's cache loads for a destination: handles by consumer, blobs read back."""
        h, m, c, d = (self.t[n] for n in ("message_handles", "messages", "consumers", "destinations"))
        stmt = (sa.select(c.c.name, h.c.sequencenumber, m.c.messageid, m.c.messageblob, m.c.createtime, h.c.acceptedtime)
                .select_from(h).join(c, sa.and_(c.c.consumerid == h.c.consumerid, c.c.destinationid == h.c.destinationid))
                .join(m, m.c.messageid == h.c.messageid).join(d, d.c.destinationid == h.c.destinationid)
                .where(d.c.name == destination).order_by(h.c.acceptedtime, h.c.sequencenumber, c.c.name))
        with self.legacy.connect() as conn:
            return [{**dict(r), "jms": decode(bytes(r["messageblob"]))} for r in conn.execute(stmt).mappings()]

    def count(self, table: str) -> int:
        with self.legacy.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(self.t[table])).scalar_one()

    def nsb_count(self, table: str) -> int:
        with self.nsb.connect() as conn:
            return conn.execute(sa.text(f'select count(*) from "{self.nsb_schema}"."{table}"')).scalar_one()


@pytest.fixture()
def jms2(pg_server: str, pg_schema: str, mariadb_database: str, tmp_path: Path):
    tw = JmsTwoWay(tmp_path, pg_server, pg_schema, mariadb_database)
    assert tw.cli("init") == 0
    yield tw
    tw.legacy.dispose()
    tw.nsb.dispose()


@pytest.mark.postgres
@pytest.mark.mariadb
def test_jms_request_reply_round_trip(jms2: JmsTwoWay) -> None:
    with jms2.legacy.begin() as conn:  # a JMS client sent text_simple (reply to queue "replies") to "orders"
        openjms_message(conn, jms2.t, "ID:3fd10110-fa9d-1004-87c4-9f06b7289907", 1, (FIXTURES / "text_simple.bin").read_bytes(), [100])
    assert jms2.cli("sync", "--once", "--job", "from-jms") == 0
    got = jms2.endpoint.receive()
    assert got is not None
    request, _ = got
    assert request["NServiceBus.CorrelationId"] == "order-12345"
    assert request["NServiceBus.ReplyToAddress"] == f'"replies"."{jms2.nsb_schema}"'  # the proxy queue
    reply = jms2.endpoint.reply(request, "Orders.Messages.OrderAccepted, Orders.Messages, Version=1.0.0.0", '{"ok":"ja, zażółć"}'.encode())

    assert jms2.cli("sync", "--once", "--job", "to-jms") == 0
    assert jms2.nsb_count("replies") == 0
    [got] = jms2.pending("replies")
    jms = got["jms"]
    assert got["name"] == "replies" and got["messageid"] == f"ID:{reply['NServiceBus.MessageId']}"
    assert jms.message_type == "TextMessage" and jms.body == {"text": '{"ok":"ja, zażółć"}'}
    h = jms.headers
    assert h["JMSCorrelationID"] == "order-12345"
    assert h["JMSDestination"]["name"] == "replies" and h["JMSDestination"]["kind"] == "queue"
    assert h["JMSType"] == "Orders.OrderAccepted" and h["JMSDeliveryMode"] == 2 and h["JMSPriority"] == 4
    assert h["JMSReplyTo"]["name"] == "Orders"
    assert jms.properties["NServiceBus.RelatedTo"]["value"] == request["NServiceBus.MessageId"]
    assert jms.properties["QBridge.Source"]["value"].startswith("nservicebus://")
    assert got["createtime"] == got["acceptedtime"] == jms.internal["acceptedTime"]
    assert jms2.cli("verify", "--job", "to-jms") == 0


@pytest.mark.postgres
@pytest.mark.mariadb
def test_publish_reaches_durable_subscribers(jms2: JmsTwoWay) -> None:
    with jms2.nsb.connect() as conn:  # `init` + the first pass routed the durable topic to the proxy queue
        assert jms2.cli("sync", "--once", "--job", "to-jms") == 0
        routes = conn.execute(sa.text(f'select endpoint, topic from "{jms2.nsb_schema}"."SubscriptionRouting"')).all()
    assert routes == [("PriceFeed", "Prices.PriceChanged")]
    headers, copies = jms2.endpoint.publish(["Prices.PriceChanged"], "Prices.PriceChanged, Prices", b'{"Sku":"X-1","Price":9.5}')
    assert copies == 1
    assert jms2.cli("sync", "--once", "--job", "to-jms") == 0
    rows = jms2.pending("prices.eu")
    assert [r["name"] for r in rows] == ["archive-sub", "billing-sub"]  # one handle per durable subscriber
    assert jms2.count("messages") == 1
    assert rows[0]["jms"].headers["JMSType"] == "prices.eu"
    assert rows[0]["jms"].headers["JMSDestination"]["kind"] == "topic"


@pytest.mark.postgres
@pytest.mark.mariadb
def test_bytes_delayed_and_missing_destinations(jms2: JmsTwoWay) -> None:
    from datetime import datetime, timedelta, timezone

    ep = jms2.endpoint
    ep.send(ep.address("replies"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send",
                                              **{"NServiceBus.ContentType": "application/octet-stream"}), b"\x00\xff\x10")
    with jms2.nsb.begin() as conn:  # one due, one for later: OpenJMS cannot hold a message until it is due
        for minutes, n in ((-1, 1), (60, 2)):
            h = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
            conn.execute(sa.text(f'insert into "{jms2.nsb_schema}"."replies.Delayed" (headers, body, due) values (:h, :b, :d)'),
                         {"h": orjson.dumps(h).decode(), "b": f'{{"n":{n}}}'.encode(), "d": datetime.now(timezone.utc) + timedelta(minutes=minutes)})
    with jms2.legacy.begin() as conn:  # the topic loses its subscribers; a proxy queue routed nowhere
        conn.execute(sa.delete(jms2.t["consumers"]).where(jms2.t["consumers"].c.destinationid == 3))
    ep.send(ep.address("PriceFeed"), ep.headers("Prices.PriceChanged, Prices", "Publish"), b'{"p":1}')
    assert jms2.cli("sync", "--once", "--job", "to-jms") == 0
    bodies = [r["jms"].body for r in jms2.pending("replies")]
    assert {"base64": "AP8Q"} in bodies and {"text": '{"n":1}'} in bodies and len(bodies) == 2
    assert jms2.nsb_count("replies.Delayed") == 1  # the one not yet due waits
    with jms2.legacy.connect() as conn:
        reasons = dict(conn.execute(sa.text("select outcome, reason from qbridge_ledger where outcome = 'skipped'")).all())
    assert "no durable subscriber" in reasons["skipped"]


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.slow
def test_sigkill_between_openjms_commit_and_nservicebus_delete(jms2: JmsTwoWay, tmp_path: Path) -> None:
    ep = jms2.endpoint
    sent = [ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send") for _ in range(10)]
    for i, h in enumerate(sent):
        ep.send(ep.address("replies"), h, orjson.dumps({"n": i}))
    kill_at(jms2, "after_target_commit", tmp_path)
    assert jms2.nsb_count("replies") == 10 and jms2.count("message_handles") == 4
    assert jms2.cli("sync", "--once", "--job", "to-jms") == 0
    ids = sorted(r["messageid"] for r in jms2.pending("replies"))
    assert ids == sorted(f"ID:{h['NServiceBus.MessageId']}" for h in sent)
    assert jms2.count("messages") == 10 and jms2.nsb_count("replies") == 0
    assert jms2.cli("verify", "--job", "to-jms") == 0
