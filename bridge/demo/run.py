"""`qbridge demo`: a legacy SQLite database with sample data, migrated into an NServiceBus-shaped one."""

from __future__ import annotations

import tempfile
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast
from zoneinfo import ZoneInfo

import orjson
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from bridge.config import load_config
from bridge.db import dispose_all, engine_for
from bridge.demo.samples import (
    biztalk_message,
    biztalk_store,
    create_nginn_queue,
    create_nginn_subscriptions,
    demo_rows,
    openjms_destination,
    openjms_message,
    openjms_store,
)
from bridge.lifecycle import init
from bridge.lifecycle.verify import verify
from bridge.pipeline.inprocess import run_inprocess
from bridge.pipeline.loop import JobRunner
from bridge.pipeline.spark import run_spark
from bridge.timefmt import to_wire, utcnow

if TYPE_CHECKING:
    from bridge.targets.nginn import NGinnTarget

MAPPING = """\
[routes]
"MQueue1" = "Orders"
"MQueue2" = "Billing"
"Sender"  = "Sales"
"*"       = "Unrouted"

[headers.rename]
"_NG-ReplyTo" = "NServiceBus.ReplyToAddress"

[headers.set]
"NServiceBus.OriginatingEndpoint" = "Legacy.{queue}"

[headers.drop]
names = ["_NG-Seq*"]

[types]
"Orders.PlaceOrder, Orders" = "Orders.Messages.PlaceOrder, Orders.Messages"

[states]
ready = "queue"
delayed = "delayed"
failed = "error"
processed = "skip"
"""

OPENJMS_MAPPING = """\
[routes]
"orders"      = "Orders"
"replies"     = "Sales"
"billing-sub" = "Billing"
"*"           = "Unrouted"

[types]
"Orders.PlaceOrder" = "Orders.Messages.PlaceOrder, Orders.Messages"
"prices.eu"         = "Prices.PriceChanged, Prices"
"""

BIZTALK_MAPPING = """\
[routes]
"http://example.org/orders#Order" = "Orders"
"*" = "Unrouted"

[types]
"http://example.org/orders#Order" = "Example.Orders.Order, Example.Orders"

[biztalk]
namespaces = { "http://example.org/orders/properties" = "Orders" }
"""

REVERSE_MAPPING = """\
# NServiceBus endpoints address the legacy NGinn endpoint "Sender" as the proxy queue "Sales"
[routes]
"Sales" = "Sender"

[types]
"Orders.OrderAccepted, Orders" = "Orders.Messages.OrderAccepted, Orders.Messages"
"""

CONFIG = """\
[connections]
legacy = "sqlite:///{legacy}"
openjms = "sqlite:///{openjms}"
msgbox = "sqlite:///{msgbox}"
nsb    = "sqlite:///{nsb}"

[[jobs]]
name     = "nginn-orders"
source   = {{ system = "nginn", connection = "legacy", queues = ["MQueue1", "MQueue2"], timezone = "Europe/Warsaw" }}
target   = {{ connection = "nsb", flavor = "postgresql" }}
mapping  = "nginn-demo.toml"
mode     = "copy"
schedule = {{ every = "5s" }}

[[jobs]]
name     = "openjms-orders"
source   = {{ system = "openjms", connection = "openjms", queues = ["orders", "prices.eu"] }}
target   = {{ connection = "nsb", flavor = "postgresql" }}
mapping  = "openjms-demo.toml"
mode     = "copy"

[[jobs]]
name     = "biztalk-orders"
source   = {{ system = "biztalk", connection = "msgbox", queues = ["BizTalkServerApplication"] }}
target   = {{ connection = "nsb", flavor = "postgresql" }}
mapping  = "biztalk-demo.toml"
mode     = "copy"

[[jobs]]
name     = "nginn-replies"
source   = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", queues = ["Sales"] }}
target   = {{ system = "nginn", connection = "legacy", timezone = "Europe/Warsaw", alias = "db" }}
mapping  = "reverse-demo.toml"
mode     = "move"
"""


def build(directory: Path) -> Path:
    """Writes the legacy database, the mapping and the config; returns the config's path."""
    legacy, openjms, nsb = directory / "legacy-nginn.db", directory / "legacy-openjms.db", directory / "nservicebus.db"
    msgbox = directory / "legacy-biztalk.db"
    for p in (legacy, openjms, msgbox, nsb):
        p.unlink(missing_ok=True)
    (directory / "nginn-demo.toml").write_text(MAPPING)
    (directory / "openjms-demo.toml").write_text(OPENJMS_MAPPING)
    (directory / "biztalk-demo.toml").write_text(BIZTALK_MAPPING)
    (directory / "reverse-demo.toml").write_text(REVERSE_MAPPING)
    config = directory / "demo.toml"
    config.write_text(CONFIG.format(legacy=legacy.as_posix(), openjms=openjms.as_posix(), msgbox=msgbox.as_posix(), nsb=nsb.as_posix()))
    _openjms_store(openjms)
    _biztalk_store(msgbox)
    engine = sa.create_engine(f"sqlite:///{legacy.as_posix()}")
    now = datetime.now(ZoneInfo("Europe/Warsaw")).replace(microsecond=0, tzinfo=None)  # NGinn writes local time
    queues = {q: create_nginn_queue(engine, q) for q in ("MQueue1", "MQueue2")}
    subs = create_nginn_subscriptions(engine)
    with engine.begin() as conn:
        for queue, t in queues.items():
            conn.execute(t.insert(), demo_rows(queue, now, count=20 if queue == "MQueue1" else 5))
        conn.execute(subs.insert(), [
            {"publisher_endpoint": "sql://db/MQueue1", "subscriber_endpoint": "sql://db/MQueue2",
             "message_type": "Orders.PlaceOrder", "created_date": now, "expiration_date": None},
        ])
    engine.dispose()
    return config


def _openjms_store(path: Path) -> None:
    """An OpenJMS store with a queue, a topic with two durable subscribers, and one corrupt blob."""
    data = Path(__file__).parent / "data"
    blob = {n: (data / n).read_bytes() for n in ("text_simple.bin", "map_msg.bin", "stream_msg.bin",
                                                 "real0761_text_durable_topic_overflowed_expiration.bin")}
    engine = sa.create_engine(f"sqlite:///{path.as_posix()}")
    with engine.begin() as conn:
        t = openjms_store(conn)
        openjms_destination(conn, t, "orders", 1, True)
        openjms_destination(conn, t, "prices.eu", 2, False, {"billing-sub": 201, "archive-sub": 202})
        openjms_message(conn, t, "ID:demo-1", 1, blob["text_simple.bin"], [100], accepted=1)
        openjms_message(conn, t, "ID:demo-2", 1, blob["map_msg.bin"], [100], accepted=2)
        openjms_message(conn, t, "ID:demo-3", 1, blob["stream_msg.bin"][:300], [100], accepted=3)  # cut short
        openjms_message(conn, t, "ID:demo-4", 2, blob["real0761_text_durable_topic_overflowed_expiration.bin"], [201, 202], accepted=4)
    engine.dispose()


def _biztalk_store(path: Path) -> None:
    """A MessageBox with two pending messages and one suspended instance for one host."""
    data = Path(__file__).parent / "data"
    ctx, suspended_ctx, part = ((data / n).read_bytes() for n in ("ctx_receive.bin", "ctx_suspended.bin", "part_small_compressed.bin"))
    engine = sa.create_engine(f"sqlite:///{path.as_posix()}")
    host = "BizTalkServerApplication"
    t = biztalk_store(engine, [host])
    with engine.begin() as conn:
        for _ in range(2):
            biztalk_message(conn, t, ctx, [("body", [part], 2146)], host=host)
        biztalk_message(conn, t, suspended_ctx, [("body", [part], 2146)], host=host, suspended={
            "nState": 4, "nvcAdapter": "FILE", "nvcURI": "D:\\BizTalk\\In\\*.xml",
            "nvcErrorDescription": "There was a failure executing the receive pipeline: no subscription was found."})
    engine.dispose()


def run_demo(directory: str | None, console: Console) -> int:
    with tempfile.TemporaryDirectory(prefix="qbridge-demo-") as tmp:
        where = (Path(directory) if directory else Path(tmp)).resolve()  # the config names its databases by absolute path
        where.mkdir(parents=True, exist_ok=True)
        config_path = build(where)
        console.print(f"legacy NGinn, OpenJMS and BizTalk databases and config written to {where}", markup=False, highlight=False)
        config = load_config(config_path)
        for p in init.plan(config, config.jobs):
            created, _ = init.create_missing(p)
            console.print(f"created {len(created)} NServiceBus and qbridge tables", markup=False)
        runners = [JobRunner(config, job) for job in config.jobs if not job.reverse]
        totals = run_spark(config, runners, console=console, master="local[*]")
        t = Table(title="what moved")
        for col in ("legacy queue", "read", "delivered", "skipped", "quarantined"):
            t.add_column(col)
        for s in totals:
            t.add_row(s.queue, str(s.read), str(s.delivered), str(s.skipped), str(s.quarantined))
        console.print(t)
        _show_target(runners[0], console)
        back = JobRunner(config, config.job("nginn-replies"))
        _round_trip(runners[0], back, console)
        books = [verify(r) for r in [*runners, back]]
        balanced = all(b.balanced for b in books)
        console.print(f"verify: {'balanced' if balanced else 'NOT balanced'}; quarantined rows keep their reason "
                      f"and raw content in qbridge_quarantine", markup=False)
        if directory:
            console.print(f"next: qbridge preview -c {config_path} shows what a migration would do before it runs; "
                          f"qbridge rollback -c {config_path} --job nginn-orders --dry-run what backing it out would "
                          "withdraw", markup=False, highlight=False)
        else:  # the temporary directory goes with the demo: a `next:` on it would name nothing
            console.print("next: qbridge demo --dir DIR keeps the databases and config, to try qbridge preview, status, "
                          "quarantine and rollback --dry-run on them", markup=False, highlight=False)
        dispose_all()
        return 0 if balanced else 1


def _round_trip(forward: JobRunner, back: JobRunner, console: Console) -> None:
    """A migrated Orders endpoint takes one PlaceOrder and replies; the reverse job brings the
    reply to the legacy NGinn endpoint that sent the request, as a row NGinn's receiver takes."""
    engine = engine_for(forward.target_url)
    orders, sales = forward.tables.queue("Orders"), forward.tables.queue("Sales")
    with engine.begin() as conn:  # the endpoint takes (and deletes) the first NGinn PlaceOrder
        # Spark's tasks commit in any order: the NGinn message with the lowest id, not the oldest row.
        prefix = "nginn://legacy-nginn/MQueue1/"
        first = min((r for r in conn.execute(sa.select(orders)).mappings()
                     if orjson.loads(r["headers"]).get("QBridge.Source", "").startswith(prefix)),
                    key=lambda r: int(orjson.loads(r["headers"])["QBridge.Source"][len(prefix):]))
        conn.execute(sa.delete(orders).where(orders.c.seq == first["seq"]))
        request = orjson.loads(first["headers"])
        reply = {
            "NServiceBus.MessageId": str(uuid.uuid4()), "NServiceBus.MessageIntent": "Reply",
            "NServiceBus.CorrelationId": request["NServiceBus.CorrelationId"],
            "NServiceBus.ConversationId": request["NServiceBus.ConversationId"],
            "NServiceBus.RelatedTo": request["NServiceBus.MessageId"],
            "NServiceBus.EnclosedMessageTypes": "Orders.Messages.OrderAccepted, Orders.Messages, Version=1.0.0.0",
            "NServiceBus.ContentType": "application/json", "NServiceBus.OriginatingEndpoint": "Orders",
            "NServiceBus.ReplyToAddress": "Orders", "NServiceBus.TimeSent": to_wire(utcnow()),
        }
        conn.execute(sa.insert(sales).values(id=uuid.uuid4(), headers=orjson.dumps(reply).decode(),
                                             body=b'{"OrderId":1,"Accepted":true}'))
    console.print(f"NServiceBus endpoint Orders took {request['NServiceBus.MessageId']} and replied to "
                  f"{request['NServiceBus.ReplyToAddress']!r}", markup=False, highlight=False)
    run_inprocess([back], console=console)
    table = cast("NGinnTarget", back.target).table("Sender")  # the nginn-replies job writes NGinn tables
    with engine_for(back.target_url).connect() as conn:
        row = conn.execute(sa.select(table).where(table.c.unique_id == reply["NServiceBus.MessageId"])).mappings().one()
    console.print(f"reply in NGinn table Sender: subqueue {row['subqueue']}, correlation_id {row['correlation_id']}, "
                  f"to_endpoint {row['to_endpoint']}, msg_text {row['msg_text']}", markup=False, highlight=False)


def _show_target(runner: JobRunner, console: Console) -> None:
    engine = engine_for(runner.target_url)
    t = Table(title="NServiceBus tables")
    t.add_column("table")
    t.add_column("rows", justify="right")
    with engine.connect() as conn:
        for name in sorted(sa.inspect(conn).get_table_names()):
            n = conn.execute(sa.select(sa.func.count()).select_from(sa.table(name))).scalar_one()
            t.add_row(name, str(n))
        reasons = conn.execute(sa.text("select queue, source_key, reason from qbridge_quarantine order by queue, source_key")).all()
    console.print(t)
    for queue, key, reason in reasons:
        console.print(f"quarantined {queue}#{key}: {reason}", markup=False, highlight=False)
