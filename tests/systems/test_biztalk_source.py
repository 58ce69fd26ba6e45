"""The BizTalk MessageBox as a source, on PostgreSQL and SQLite, into an NServiceBus-shaped target."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.demo.samples import biztalk_message, biztalk_store
from helpers import Bridge, kill_at, walk_slices

FIX = Path(__file__).parents[1] / "fixtures" / "biztalk"
MT_PROP = "1ad2c9bd-1c4f-4c49-8a41-0b09e3c2e8a1"  # stands for BTS.MessageType's bt_DocumentSpec id
MAPPING = f"""
[routes]
"http://example.org/orders#Order" = "Orders"
"SendOrdersToSap" = "Sap"
"*" = "Unrouted"

[types]
"http://example.org/orders#Order" = "Example.Orders.Order, Example.Orders"

[biztalk]
message_type_property_id = "{MT_PROP}"
namespaces = {{ "http://example.org/orders/properties" = "Orders" }}
"""


def fx(name: str) -> bytes:
    return (FIX / name).read_bytes()


class BizTalk(Bridge):
    def seed(self) -> None:
        self.bt = biztalk_store(self.source, ["BizTalkServerApplication"], self.source_schema)

    def publish(self, **kw) -> tuple:
        with self.source.begin() as conn:
            return biztalk_message(conn, self.bt, host="BizTalkServerApplication", **kw)

    def count_rows(self, table: str) -> int:
        with self.source.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(self.bt[table])).scalar_one()


@pytest.fixture(params=["sqlite", "postgres"])
def bt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BizTalk]:
    yield from make_bt(request.param, request, tmp_path)


def make_bt(kind: str, request, tmp_path: Path, **kw) -> Iterator[BizTalk]:
    kw.setdefault("mapping", MAPPING)
    if kind == "sqlite":
        b = BizTalk(tmp_path, f"sqlite:///{tmp_path}/msgbox.db", f"sqlite:///{tmp_path}/nsb.db", system="biztalk",
                    queues=["BizTalkServerApplication"], **kw)
    else:
        schema, url = request.getfixturevalue("pg_schema"), request.getfixturevalue("pg_server")
        b = BizTalk(tmp_path, url, url, source_schema=schema, target_schema=schema, system="biztalk",
                    queues=["BizTalkServerApplication"], **kw)
    b.seed()
    assert b.cli("init") == 0
    yield b
    b.dispose()


SMALL = ("body", [fx("part_small_compressed.bin")], 2146)
FRAGMENTED = ("body", [fx("frag_0.bin"), fx("frag_1.bin"), fx("frag_2.bin")], 290319)


def test_work_queue_entry_becomes_a_message(bt: BizTalk) -> None:
    bt.publish(context=fx("ctx_receive.bin"), parts=[FRAGMENTED, ("attachment", [fx("part_small_uncompressed.bin")], 189)])
    assert bt.cli("sync", "--once") == 0
    [row] = bt.rows("Orders")
    h = row["headers"]
    assert h["NServiceBus.EnclosedMessageTypes"] == "Example.Orders.Order, Example.Orders"
    assert h["NServiceBus.ConversationId"] == "{7D1C3A52-0F4E-4B8B-9C2D-5E6F7A8B9C0D}"  # BTS.InterchangeID
    assert h["BTS.ReceivePortName"] == "rpOrders" and h["FILE.ReceivedFileName"].endswith("№4711.xml")
    assert h["Orders.CustomerName"].startswith("Zoë") and h["Orders.IsRush"] == "false"
    assert h["NServiceBus.ContentType"] == "application/xml"
    body = bytes(row["body"])
    assert len(body) == 290319 and hashlib.sha256(body).hexdigest() == json.loads((FIX / "manifest.json").read_text())["fragmented_message"]["decoded_sha256"]
    assert json.loads(h["QBridge.Parts"]) == ["attachment"]
    assert base64.b64decode(h["QBridge.Part.attachment"]).startswith(b"<?xml")
    assert bt.cli("sync", "--once") == 0
    assert bt.count("Orders") == 1
    assert bt.cli("verify") == 0


def test_suspended_instance_goes_to_error_with_servicecontrol_headers(bt: BizTalk) -> None:
    bt.publish(context=fx("ctx_suspended.bin"), parts=[SMALL], suspended={
        "nState": 4, "dtSuspendTimeStamp": datetime(2024, 3, 14, 9, 27, 2), "nvcAdapter": "FILE",
        "nvcURI": "D:\\BizTalk\\In\\*.xml", "nvcErrorDescription": "There was a failure executing the receive pipeline.\r\nDetails...",
        "info": "routing failure"})
    assert bt.cli("sync", "--once") == 0
    [e] = bt.rows("error")
    h = e["headers"]
    assert h["NServiceBus.FailedQ"] == bt.runner().tables.address("Orders")
    assert h["NServiceBus.ExceptionInfo.Message"] == "There was a failure executing the receive pipeline."
    assert h["NServiceBus.TimeOfFailure"] == "2024-03-14 08:27:02:000000 Z"  # the test jobs say Europe/Warsaw
    assert h["BizTalk.Resumable"] == "true" and h["BizTalk.Adapter"] == "FILE"
    assert h["NServiceBus.ExceptionInfo.ExceptionType"].startswith("BizTalk.Suspended")


def test_bad_messages_are_quarantined_and_the_rest_delivered(bt: BizTalk) -> None:
    bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
    bt.publish(context=fx("ctx_receive.bin")[:-7], parts=[SMALL])  # corrupt context
    bt.publish(context=fx("ctx_receive.bin"), parts=[("body", [fx("frag_0.bin"), fx("frag_1.bin")], 290319)])  # a fragment missing
    bad_block = bytearray(fx("part_small_compressed.bin"))
    bad_block[30] ^= 0xFF
    bt.publish(context=fx("ctx_receive.bin"), parts=[("body", [bytes(bad_block)], 2146)])
    assert bt.cli("sync", "--once") == 0
    assert bt.count("Orders") == 1
    with bt.target.connect() as conn:
        prefix = f'"{bt.target_schema}".' if bt.target_schema else ""
        reasons = [r for (r,) in conn.execute(sa.text(f"select reason from {prefix}qbridge_quarantine"))]
    assert len(reasons) == 3
    assert any("string length" in r or "truncated" in r for r in reasons)  # the cut context
    assert any("compressed block" in r or "block at offset" in r for r in reasons)
    assert any("290319" in r for r in reasons)
    assert bt.cli("verify") == 0


def test_move_mode_removes_only_the_work_queue_entry(tmp_path: Path, request) -> None:
    for b in make_bt("sqlite", request, tmp_path, mode="move"):
        b.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        assert b.cli("sync", "--once") == 0
        assert b.count("Orders") == 1
        assert b.count_rows("BizTalkServerApplicationQ") == 0
        assert b.count_rows("Spool") == 1 and b.count_rows("Parts") == 1
        assert b.cli("sync", "--once") == 0 and b.count("Orders") == 1


def test_subscriptions_on_message_type_only_are_migrated(bt: BizTalk, capsys: pytest.CaptureFixture[str]) -> None:
    sub, pg, eq = bt.bt["Subscription"], bt.bt["PredicateGroup"], bt.bt["EqualsPredicates"]
    with bt.source.begin() as conn:
        for name, prop, value in (("SendOrdersToSap", MT_PROP, "http://example.org/orders#Order"),
                                  ("ArchiveByPort", str(uuid.uuid4()), "rpOrders")):
            or_group, and_group = uuid.uuid4(), uuid.uuid4()
            conn.execute(sub.insert().values(uidSubID=uuid.uuid4(), nvcName=name, uidPredicateGroupID=or_group))
            conn.execute(pg.insert().values(uidPredicateORGroupID=or_group, uidPredicateANDGroupID=and_group))
            conn.execute(eq.insert().values(uidPredicateGroupID=and_group, uidPropID=uuid.UUID(prop), vtValue=value, nID=1))
    assert bt.cli("sync", "--once") == 0
    with bt.target.connect() as conn:
        prefix = f'"{bt.target_schema}".' if bt.target_schema else ""
        rows = [tuple(r) for r in conn.execute(sa.text(f'select endpoint, topic from {prefix}"SubscriptionRouting"'))]
    assert rows == [("Sap", "Example.Orders.Order")]
    capsys.readouterr()
    assert bt.cli("verify", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    listed = report["jobs"][0]["unroutable_subscriptions"]
    assert [s["endpoint"] for s in listed] == ["ArchiveByPort"]


def test_late_commit_is_delivered_once(tmp_path: Path, request) -> None:
    for b in make_bt("postgres", request, tmp_path):
        b.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        slow = b.source.connect()
        tx = slow.begin()
        biztalk_message(slow, b.bt, fx("ctx_receive.bin"), [SMALL], host="BizTalkServerApplication")
        b.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        assert b.cli("sync", "--once") == 0
        assert b.count("Orders") == 2
        tx.commit()
        slow.close()
        assert b.cli("sync", "--once") == 0
        ids = b.message_ids("Orders")
        assert len(ids) == 3 and set(ids.values()) == {1}
        assert b.cli("verify") == 0


@pytest.mark.slow
def test_sigkill_between_commits_in_move_mode(tmp_path: Path, request) -> None:
    for b in make_bt("postgres", request, tmp_path, mode="move", batch_size=5):
        for _ in range(12):
            b.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        kill_at(b, "after_target_commit", tmp_path)
        assert b.count("Orders") == 5 and b.count_rows("BizTalkServerApplicationQ") == 12
        assert b.cli("sync", "--once") == 0
        ids = b.message_ids("Orders")
        assert len(ids) == 12 and set(ids.values()) == {1}
        assert b.count_rows("BizTalkServerApplicationQ") == 0
        assert b.cli("verify") == 0


def test_messagebox_layout_compiles_for_sql_server() -> None:
    from sqlalchemy.dialects import mssql

    from bridge.schemas.biztalk import tables

    t = tables("dbo", ["BizTalkServerApplication"])
    spool = str(sa.schema.CreateTable(t["Spool"]).compile(dialect=mssql.dialect()))
    assert '[uidMessageID] UNIQUEIDENTIFIER NOT NULL' in spool and "[imgContext] IMAGE" in spool
    q = str(sa.delete(t["BizTalkServerApplicationQ"]).where(t["BizTalkServerApplicationQ"].c.uidMessageID == uuid.uuid4())
            .compile(dialect=mssql.dialect()))
    assert q.startswith("DELETE FROM dbo.[BizTalkServerApplicationQ] WHERE")


def test_slices_page_each_queue_on_its_own_key_and_cover_every_entry_once(bt: BizTalk) -> None:
    """Spark's slices of the MessageBox: boundaries from the database over work and suspended
    queues together; pages read each queue by its own primary key; every entry exactly once."""
    import uuid

    with bt.source.begin() as conn:
        for table, n in (("BizTalkServerApplicationQ", 17), ("BizTalkServerApplicationQ_Suspended", 9)):
            conn.execute(bt.bt[table].insert(), [{"uidMessageID": uuid.uuid4(), "uidInstanceID": uuid.uuid4()} for _ in range(n)])
    source = bt.runner().sources["BizTalkServerApplication"]
    with bt.source.connect() as conn:
        everything = list(source.iter_slice(conn, None, None))
        assert len(everything) == 26 and [k[0] for k in everything] == ["Q"] * 17 + ["S"] * 9
        assert sorted(everything) == sorted(source.iter_keys(conn))
        bounds = source.slice_boundaries(conn, 5)
        assert len(bounds) == 5 and source.count_keys(conn) == 26
        assert {b[0] for b in bounds} == {"Q", "S"}  # a slice straddles the two queues
        seen = walk_slices(source, conn, bounds, 3)
    assert seen == everything and len(set(seen)) == 26


def test_one_batch_reads_every_instance_of_a_message_and_parts_two_messages_share(bt: BizTalk) -> None:
    """Entries are fetched a batch at a time: two instances of one message (two subscribers on
    the host) are two messages, and a fragmented part BizTalk shares between two messages
    reaches both whole."""
    import uuid

    message, _ = bt.publish(context=fx("ctx_receive.bin"), parts=[FRAGMENTED])
    other, second = uuid.uuid4(), uuid.uuid4()
    with bt.source.begin() as conn:
        conn.execute(bt.bt["BizTalkServerApplicationQ"].insert().values(uidMessageID=message, uidInstanceID=second))
        spool = conn.execute(sa.select(bt.bt["Spool"]).where(bt.bt["Spool"].c.uidMessageID == message)).mappings().one()
        conn.execute(bt.bt["Spool"].insert().values({**spool, "uidMessageID": other}))
        conn.execute(bt.bt["MessageParts"].insert().values(uidMessageID=other, uidPartID=spool["uidBodyPartID"],
                                                            nvcPartName="body", nBodyPart=1))
        conn.execute(bt.bt["BizTalkServerApplicationQ"].insert().values(uidMessageID=other, uidInstanceID=uuid.uuid4()))
    assert bt.cli("sync", "--once") == 0
    rows = bt.rows("Orders")
    assert len(rows) == 3 and len({r["headers"]["NServiceBus.MessageId"] for r in rows}) == 3
    assert {r["headers"]["BizTalk.MessageID"] for r in rows} == {str(message), str(other)}
    assert all(len(bytes(r["body"])) == 290319 for r in rows)
    assert bt.cli("verify") == 0
