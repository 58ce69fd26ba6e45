"""Reverse jobs, NServiceBus -> NGinn, on real PostgreSQL: request/reply and publish/subscribe
round trips with a legacy NGinn endpoint, crashes between the two commits, quarantine, echo."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson
import pytest
import sqlalchemy as sa

from bridge.commands.main import main as cli_main
from bridge.codecs import nginn as nginn_codec
from bridge.demo.samples import create_nginn_queue, create_nginn_subscriptions, nginn_row
from helpers import kill_at
from nsb_endpoint import Endpoint

TZ = "Europe/Warsaw"
FORWARD_MAPPING = """
[routes]
"Orders" = "Orders"
[headers.rename]
"_NG-ReplyTo" = "NServiceBus.ReplyToAddress"
[types]
"Orders.PlaceOrder, Orders" = "Orders.Messages.PlaceOrder, Orders.Messages"
"""
REVERSE_MAPPING = """
[routes]
"Sender" = "Sender"
[headers.rename]
"Tenant" = "X-Tenant"
[headers.set]
"Bridge" = "qbridge {queue}"
[types]
"Orders.OrderAccepted, Orders" = "Orders.Messages.OrderAccepted, Orders.Messages"
"Orders.OrderShipped, Orders" = "Orders.Messages.OrderShipped, Orders.Messages"
"""


class TwoWay:
    """A legacy NGinn schema and an NServiceBus schema on one PostgreSQL, with a forward job
    (NGinn Orders -> NServiceBus Orders) and a reverse job (proxy queue Sender -> NGinn Sender)."""

    def __init__(self, tmp: Path, url: str, legacy: str, nsb: str, flavor: str = "postgresql") -> None:
        self.tmp, self.url, self.legacy_schema, self.nsb_schema, self.flavor = tmp, url, legacy, nsb, flavor
        self.engine = sa.create_engine(url)
        self.orders = create_nginn_queue(self.engine, "Orders", legacy)
        self.sender = create_nginn_queue(self.engine, "Sender", legacy)
        (tmp / "forward.toml").write_text(FORWARD_MAPPING)
        (tmp / "reverse.toml").write_text(REVERSE_MAPPING)
        self.config = tmp / "bridge.toml"
        self.write_config()
        self.endpoint = Endpoint(self.engine, nsb, "Orders", flavor)

    def write_config(self, batch_size: int = 1000, schedule: str = "") -> None:
        self.config.write_text(f"""
[connections]
legacy = "{self.url}"
nsb    = "{self.url}"

[[jobs]]
name   = "from-legacy"
source = {{ system = "nginn", connection = "legacy", queues = ["Orders"], timezone = "{TZ}", schema = "{self.legacy_schema}", database = "shop" }}
target = {{ connection = "nsb", flavor = "{self.flavor}", schema = "{self.nsb_schema}", database = "nsb" }}
mapping = "forward.toml"
mode = "move"
{schedule}

[[jobs]]
name   = "to-legacy"
source = {{ system = "nservicebus", connection = "nsb", flavor = "{self.flavor}", schema = "{self.nsb_schema}", queues = ["Sender"], database = "nsb" }}
target = {{ system = "nginn", connection = "legacy", timezone = "{TZ}", schema = "{self.legacy_schema}", database = "shop", alias = "db" }}
mapping = "reverse.toml"
mode = "move"
batch_size = {batch_size}
{schedule}
""")

    def cli(self, *args: str) -> int:
        return cli_main([args[0], "-c", str(self.config), *args[1:]])

    def spawn(self, *args: str, env: dict[str, str] | None = None, job: str | None = "to-legacy") -> subprocess.Popen[bytes]:
        """`qbridge ARGS --job to-legacy` in its own process (for the SIGKILL tests)."""
        cmd = [sys.executable, "-m", "bridge", args[0], "-c", str(self.config), *args[1:], *(["--job", job] if job else [])]
        return subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def now_local(self) -> datetime:
        return datetime.now(ZoneInfo(TZ)).replace(tzinfo=None, microsecond=0)

    def nginn_receive(self, queue: sa.Table) -> dict | None:
        """NGinn's SelectAndLockNext1/2 (PostgreSQL spelling), then its header and body parsing."""
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(queue).where(queue.c.subqueue == "I").order_by(queue.c.retry_time)
                               .limit(1).with_for_update(skip_locked=True)).mappings().first()
            if row is None:
                return None
            conn.execute(sa.update(queue).where(queue.c.id == row["id"], queue.c.subqueue == "I").values(subqueue="X"))
        out = dict(row)
        out["headers"] = nginn_codec.parse_headers(row["msg_headers"])
        out["body"] = orjson.loads(row["msg_text"])
        return out

    def rows(self, queue: sa.Table) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(sa.select(queue).order_by(queue.c.id)).mappings()]

    def nsb_count(self, table: str) -> int:
        with self.engine.connect() as conn:
            return conn.execute(sa.text(f'select count(*) from "{self.nsb_schema}"."{table}"')).scalar_one()


@pytest.fixture()
def two_way(pg_server: str, pg_schema: str, pg_schema2: str, tmp_path: Path):
    def make(flavor: str = "postgresql") -> TwoWay:
        tw = TwoWay(tmp_path, pg_server, pg_schema, pg_schema2, flavor)
        assert tw.cli("init") == 0
        return tw
    return make


def _body(type_name: str, **fields: object) -> bytes:
    return orjson.dumps(fields)  # NServiceBus's JSON serializers write no type into the body


@pytest.mark.postgres
def test_request_reply_round_trip(two_way) -> None:
    tw = two_way()
    now = tw.now_local()
    with tw.engine.begin() as conn:  # the legacy endpoint "Sender" sends PlaceOrder to Orders
        conn.execute(tw.orders.insert().values(nginn_row("Orders", 7, now, headers="_NG-ReplyTo=sql://db/Sender|Tenant=acme")))
    assert tw.cli("sync", "--once", "--job", "from-legacy") == 0

    got = tw.endpoint.receive()  # the migrated Orders endpoint
    assert got is not None
    request, body = got
    assert orjson.loads(body)["OrderId"] == 7
    assert request["NServiceBus.CorrelationId"] == "corr-7"
    reply = tw.endpoint.reply(request, "Orders.Messages.OrderAccepted, Orders.Messages, Version=1.0.0.0, Culture=neutral, "
                              "PublicKeyToken=null", b'{"OrderId":7,"Accepted":true,"At":"2026-11-22T10:00:00Z"}')
    assert tw.nsb_count("Sender") == 1

    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    assert tw.nsb_count("Sender") == 0  # consumed, as the transport's receive would
    got = tw.nginn_receive(tw.sender)
    assert got is not None, "the reply is not a row NGinn's receiver takes"
    assert got["correlation_id"] == "corr-7"
    assert got["to_endpoint"] == "sql://db/Sender"
    assert got["unique_id"] == reply["NServiceBus.MessageId"]
    assert list(got["body"]) == ["$type", "OrderId", "Accepted", "At"]
    assert got["body"]["$type"] == "Orders.OrderAccepted, Orders"
    assert got["headers"]["_NG-ReplyTo"] == "sql://db/Orders"
    assert got["headers"]["NServiceBus.RelatedTo"] == request["NServiceBus.MessageId"]
    assert got["headers"]["Bridge"] == "qbridge Sender"
    assert not any(k.startswith("$.") or k == "NServiceBus.EnclosedMessageTypes" for k in got["headers"])
    assert got["label"] == "Orders.OrderAccepted"
    local_now = tw.now_local()
    assert abs((got["insert_time"] - local_now).total_seconds()) < 120  # server-local, not UTC

    assert tw.cli("verify") == 0
    assert tw.cli("sync", "--once") == 0  # nothing new: nothing doubled
    assert len(tw.rows(tw.sender)) == 1


@pytest.mark.postgres
def test_status_and_verify_of_a_reverse_job(two_way, capsys) -> None:
    tw = two_way()
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    for _ in range(3):
        ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), b'{"a":1}')
    capsys.readouterr()
    assert tw.cli("status", "--job", "to-legacy", "--json") == 0
    before = orjson.loads(capsys.readouterr().out)["jobs"][0]
    assert before["backlog"] == 3 and before["rows_moved"] == 0
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    capsys.readouterr()
    assert tw.cli("status", "--job", "to-legacy", "--json") == 0
    after = orjson.loads(capsys.readouterr().out)["jobs"][0]
    assert after["backlog"] == 0 and after["rows_moved"] == 3 and after["last_run"]
    assert tw.cli("verify", "--job", "to-legacy", "--json") == 0
    books = orjson.loads(capsys.readouterr().out)["jobs"][0]["queues"][0]
    assert (books["queue"], books["delivered"], books["backlog"], books["pending"]) == ("Sender", 3, 0, 0)
    assert tw.cli("verify", "--job", "to-legacy", "--deep") == 2  # content hashes are for NServiceBus targets


@pytest.mark.postgres
def test_forward_job_does_not_echo_a_message_back_to_its_nservicebus_queue(two_way) -> None:
    tw = two_way()
    with tw.engine.begin() as conn:
        conn.execute(tw.orders.insert().values(nginn_row("Orders", 1, tw.now_local(), headers="QBridge.Source=nservicebus://nsb/Orders/m-1")))
        conn.execute(tw.orders.insert().values(nginn_row("Orders", 2, tw.now_local(), headers="QBridge.Source=nservicebus://nsb/Billing/m-2")))
    assert tw.cli("sync", "--once", "--job", "from-legacy") == 0
    assert tw.nsb_count("Orders") == 1  # only the one that came from another NServiceBus queue
    with tw.engine.connect() as conn:
        # NGinn keys are range bits, which keep no reason; the totals count skips by rule.
        reason = conn.execute(sa.text(f"select distinct reason from \"{tw.nsb_schema}\".qbridge_totals where outcome = 'skipped'")).scalar_one()
    assert reason.startswith("echo: the message came from nservicebus queue 'Orders'")


@pytest.mark.postgres
def test_publish_reaches_a_legacy_subscriber(two_way) -> None:
    tw = two_way()
    subs = create_nginn_subscriptions(tw.engine, schema=tw.legacy_schema)
    with tw.engine.begin() as conn:
        conn.execute(subs.insert().values(publisher_endpoint="sql://db/Orders", subscriber_endpoint="sql://db/Sender",
                                          message_type="Orders.OrderShipped", created_date=tw.now_local()))
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0  # routes the subscription to the proxy queue
    headers, copies = tw.endpoint.publish(["Orders.Messages.OrderShipped"], "Orders.Messages.OrderShipped, Orders.Messages",
                                          b'{"OrderId":9}')
    assert copies == 1
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    got = tw.nginn_receive(tw.sender)
    assert got is not None
    assert got["body"] == {"$type": "Orders.OrderShipped, Orders", "OrderId": 9}
    assert got["headers"]["NServiceBus.MessageIntent"] == "Publish"
    assert got["unique_id"] == headers["NServiceBus.MessageId"]


@pytest.mark.postgres
def test_delayed_expired_bad_bodies_and_unknown_types(two_way) -> None:
    tw = two_way()
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    ok = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    ep.send(ep.address("Sender"), ok, b'{"OrderId":1}')
    ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), b"<xml/>")
    ep.send(ep.address("Sender"), ep.headers("Orders.Messages.Unknown, Orders.Messages", "Send"), b'{"a":1}')
    ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), b'[1,2]')
    ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), b'{"x":1}', ttbr_ms=-1000)
    bad_header = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send", Filter="a=b")
    ep.send(ep.address("Sender"), bad_header, b'{"x":2}')
    with tw.engine.begin() as conn:  # a delayed send (the transport's .Delayed table) and a poison row
        due = datetime.now(ZoneInfo("UTC")) + timedelta(hours=1)
        delayed = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
        conn.execute(sa.text(f'insert into "{tw.nsb_schema}"."Sender.Delayed" (headers, body, due) values (:h, :b, :d)'),
                     {"h": orjson.dumps(delayed).decode(), "b": b'{"OrderId":2}', "d": due})
        conn.execute(sa.text(f'insert into "{tw.nsb_schema}"."Sender" (id, headers, body) values (gen_random_uuid(), :h, :b)'),
                     {"h": "not json", "b": b"{}"})
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    assert tw.nsb_count("Sender") == 0 and tw.nsb_count("Sender.Delayed") == 0  # nothing blocks the queue

    rows = {r["unique_id"]: r for r in tw.rows(tw.sender)}
    assert set(rows) == {ok["NServiceBus.MessageId"], delayed["NServiceBus.MessageId"]}
    d = rows[delayed["NServiceBus.MessageId"]]
    assert d["subqueue"] == "R"
    assert abs((d["retry_time"] - due.astimezone(ZoneInfo(TZ)).replace(tzinfo=None)).total_seconds()) < 1

    with tw.engine.connect() as conn:
        q = conn.execute(sa.text(f'select source_key, reason, raw from "{tw.legacy_schema}".qbridge_quarantine')).all()
        ledger = dict(conn.execute(sa.text(f'select outcome, count(*) from "{tw.legacy_schema}".qbridge_ledger group by outcome')).all())
    reasons = " | ".join(r for _, r, _ in q)
    assert len(q) == 5, reasons
    for needle in ("not JSON", "has no legacy name", "not an object", "holds '|' or '='", "headers column is not NServiceBus's JSON"):
        assert needle in reasons
    assert all(orjson.loads(raw)["headers"] for _, _, raw in q)  # the whole row is kept
    assert ledger == {"delivered": 2, "quarantined": 5, "skipped": 1}  # the expired one is skipped
    assert tw.cli("verify", "--job", "to-legacy") == 0


@pytest.mark.postgres
def test_echo_is_not_sent_back(two_way) -> None:
    """A message the forward job took from NGinn Sender never returns into NGinn Sender."""
    tw = two_way()
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    echo = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send", **{"QBridge.Source": "nginn://shop/Sender/41"})
    ep.send(ep.address("Sender"), echo, b'{"OrderId":1}')
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    assert tw.rows(tw.sender) == []
    with tw.engine.connect() as conn:
        reason = conn.execute(sa.text(f'select reason from "{tw.legacy_schema}".qbridge_ledger')).scalar_one()
    assert reason.startswith("echo:")


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["postgresql", "sqlserver"])
def test_sigkill_between_legacy_commit_and_nservicebus_delete(two_way, flavor: str, tmp_path: Path) -> None:
    tw = two_way(flavor)
    tw.write_config(batch_size=7)
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders", flavor)
    sent = [ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send") for _ in range(20)]
    for i, h in enumerate(sent):
        ep.send(ep.address("Sender"), h, orjson.dumps({"OrderId": i}))
    ep.send(ep.address("Sender"), sent[3], orjson.dumps({"OrderId": 3}))  # the same message sent twice
    kill_at(tw, "after_target_commit", tmp_path)  # NGinn rows committed, NServiceBus rows not deleted
    assert tw.nsb_count("Sender") == 21
    assert len(tw.rows(tw.sender)) == 7
    kill_at(tw, "before_target_commit", tmp_path)
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    assert tw.nsb_count("Sender") == 0
    ids = [r["unique_id"] for r in tw.rows(tw.sender)]
    assert sorted(ids) == sorted(h["NServiceBus.MessageId"] for h in sent)  # each exactly once
    assert tw.cli("verify", "--job", "to-legacy") == 0


@pytest.mark.postgres
def test_config_refuses_copy_and_incomplete_reverse_jobs(tmp_path: Path, capsys) -> None:
    (tmp_path / "m.toml").write_text(REVERSE_MAPPING)
    base = """
[connections]
a = "sqlite:///a.db"
[[jobs]]
name = "r"
mapping = "m.toml"
"""
    cases = {
        'source = { system = "nservicebus", connection = "a", flavor = "postgresql", queues = ["S"] }\n'
        'target = { system = "nginn", connection = "a", timezone = "UTC" }\nmode = "copy"': "always consumes",
        'source = { system = "nservicebus", connection = "a", queues = ["S"] }\n'
        'target = { system = "nginn", connection = "a", timezone = "UTC" }': "source.flavor: required",
        'source = { system = "nservicebus", connection = "a", flavor = "postgresql", queues = ["S"] }\n'
        'target = { system = "nginn", connection = "a" }': "target.timezone: required",
        'source = { system = "nservicebus", connection = "a", flavor = "postgresql", queues = ["S"] }\n'
        'target = { connection = "a", flavor = "postgresql" }': "writes a legacy system",
        'source = { system = "nginn", connection = "a", queues = ["S"], timezone = "UTC" }\n'
        'target = { system = "openjms", connection = "a" }': "one side of a job is NServiceBus",
    }
    for body, needle in cases.items():
        (tmp_path / "c.toml").write_text(base + body)
        assert cli_main(["verify", "-c", str(tmp_path / "c.toml")]) == 2
        assert needle in " ".join(capsys.readouterr().err.split())


def mariadb_reverse_config(tmp_path: Path, pg_server: str, pg_schema: str, mariadb_database: str, batch_size: int) -> Path:
    """A reverse job from a PostgreSQL proxy queue "Sender" into NGinn on MariaDB, whose ledger
    and checkpoint then live in MariaDB; `init` not run yet."""
    (tmp_path / "reverse.toml").write_text(REVERSE_MAPPING)
    config = tmp_path / "c.toml"
    config.write_text(f"""
[connections]
nsb    = "{pg_server}"
legacy = "{mariadb_database}"
[[jobs]]
name   = "to-legacy"
source = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{pg_schema}", queues = ["Sender"] }}
target = {{ system = "nginn", connection = "legacy", timezone = "{TZ}", alias = "db" }}
mapping = "reverse.toml"
batch_size = {batch_size}
""")
    return config


@pytest.mark.postgres
@pytest.mark.mariadb
def test_reverse_into_nginn_on_mariadb(pg_server: str, pg_schema: str, mariadb_database: str, tmp_path: Path) -> None:
    """The ledger lives beside the legacy rows it guards, here in MariaDB (through pyodbc)."""
    config = mariadb_reverse_config(tmp_path, pg_server, pg_schema, mariadb_database, batch_size=2)
    assert cli_main(["init", "-c", str(config)]) == 0
    engine = sa.create_engine(pg_server)
    ep = Endpoint(engine, pg_schema, "Orders")
    sent = [ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send", Tenant="acme") for _ in range(5)]
    for i, h in enumerate(sent):
        ep.send(ep.address("Sender"), h, orjson.dumps({"OrderId": i, "Name": "Zażółć"}))
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0
    legacy = sa.create_engine(mariadb_database)
    table = create_nginn_queue(legacy, "Sender")
    with legacy.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.id)).mappings().all()
    legacy.dispose()
    engine.dispose()
    assert [r["unique_id"] for r in rows] == [h["NServiceBus.MessageId"] for h in sent]
    assert orjson.loads(rows[0]["msg_text"]) == {"$type": "Orders.OrderAccepted, Orders", "OrderId": 0, "Name": "Zażółć"}
    assert nginn_codec.parse_headers(rows[0]["msg_headers"])["X-Tenant"] == "acme"
    assert cli_main(["verify", "-c", str(config)]) == 0


@pytest.mark.postgres
@pytest.mark.slow
def test_one_run_serves_both_directions(two_way) -> None:
    import signal
    import time

    tw = two_way()
    tw.write_config(schedule='schedule = { every = "500ms" }')
    proc = tw.spawn("run", job=None)
    try:
        with tw.engine.begin() as conn:
            conn.execute(tw.orders.insert().values(nginn_row("Orders", 1, tw.now_local(), headers="_NG-ReplyTo=sql://db/Sender")))
        deadline = time.monotonic() + 30
        while (got := tw.endpoint.receive()) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "the request never reached NServiceBus"
            time.sleep(0.1)
        tw.endpoint.reply(got[0], "Orders.Messages.OrderAccepted, Orders.Messages", b'{"OrderId":1}')
        while (reply := tw.nginn_receive(tw.sender)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "the reply never reached NGinn"
            time.sleep(0.1)
        assert reply["correlation_id"] == "corr-1"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"job=to-legacy queue=Sender rows=1 delivered=1" in err


@pytest.mark.postgres
@pytest.mark.slow
def test_migrate_runs_both_directions(two_way) -> None:
    """`migrate` on Spark: forward units on the executors, the proxy queue drained by the closing pass."""
    tw = two_way()
    with tw.engine.begin() as conn:
        conn.execute(tw.orders.insert(), [nginn_row("Orders", i, tw.now_local()) for i in range(1, 41)])
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    sent = [ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Reply") for _ in range(25)]
    for h in sent:
        ep.send(ep.address("Sender"), h, b'{"ok":true}')
    assert tw.cli("migrate", "--master", "local[2]") == 0
    assert tw.nsb_count("Orders") == 40 and tw.nsb_count("Sender") == 0
    assert sorted(r["unique_id"] for r in tw.rows(tw.sender)) == sorted(h["NServiceBus.MessageId"] for h in sent)
    assert tw.cli("verify") == 0


@pytest.mark.postgres
def test_a_late_commit_in_the_proxy_queue_is_not_skipped(two_way) -> None:
    """A send whose transaction commits after a later one was moved (lower seq, later commit)."""
    tw = two_way()
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    late_headers = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    early = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    with tw.engine.connect() as slow:
        tx = slow.begin()  # takes a seq first, commits last
        slow.execute(sa.text(f'insert into "{tw.nsb_schema}"."Sender" (id, headers, body) values (gen_random_uuid(), :h, :b)'),
                     {"h": orjson.dumps(late_headers).decode(), "b": b'{"n":1}'})
        ep.send(ep.address("Sender"), early, b'{"n":2}')
        assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
        assert [r["unique_id"] for r in tw.rows(tw.sender)] == [early["NServiceBus.MessageId"]]
        tx.commit()
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    assert sorted(r["unique_id"] for r in tw.rows(tw.sender)) == sorted([early["NServiceBus.MessageId"], late_headers["NServiceBus.MessageId"]])
    assert tw.nsb_count("Sender") == 0 and tw.cli("verify", "--job", "to-legacy") == 0
