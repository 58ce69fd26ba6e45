"""Sample legacy data, shaped as the real systems write it: for the demo, tests and benchmarks."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import orjson
import sqlalchemy as sa

from bridge.schemas.nginn import queue_table, subscription_table

DOTNET_ERROR = (
    "System.InvalidOperationException: Order 42 cannot be shipped: no stock ---> "
    "System.Data.SqlClient.SqlException: Timeout expired\r\n"
    "   at System.Data.SqlClient.SqlConnection.OnError(SqlException exception)\r\n"
    "   --- End of inner exception stack trace ---\r\n"
    "   at Shop.Handlers.ShipOrderHandler.Handle(ShipOrder message) in c:\\src\\Shop\\ShipOrderHandler.cs:line 31\r\n"
    "   at NGinnBPM.MessageBus.Impl.MessageDispatcher.Dispatch(Object message)"
)


def create_nginn_queue(engine: sa.Engine, name: str, schema: str | None = None) -> sa.Table:
    t = queue_table(name, schema)
    # Listing names, not `checkfirst`: MariaDB Connector/ODBC sometimes drops the "doesn't exist"
    # error of a DESCRIBE on a non-ASCII name, which SQLAlchemy's has_table needs to see.
    if name not in sa.inspect(engine).get_table_names(schema=schema):
        t.create(engine)
    return t


def create_nginn_subscriptions(engine: sa.Engine, name: str = "NGMB_Subscriptions", schema: str | None = None) -> sa.Table:
    t = subscription_table(name, schema)
    t.create(engine, checkfirst=True)
    return t


def nginn_body(type_name: str, **fields: Any) -> str:
    """A Newtonsoft body with TypeNameHandling.Objects: `$type` first, as it writes it."""
    return orjson.dumps({"$type": type_name, **fields}).decode()


def nginn_row(
    queue: str,
    n: int,
    now: datetime,
    subqueue: str = "I",
    body: str | None = None,
    headers: str | None = "",
    error_info: str | None = None,
    retry_time: datetime | None = None,
    alias: str = "db",
) -> dict[str, Any]:
    """One queue-table row as NGinn's InsertMessageBatch writes it (local times, naive)."""
    return {
        "from_endpoint": f"sql://{alias}/Sender",
        "to_endpoint": f"sql://{alias}/{queue}",
        "subqueue": subqueue,
        "insert_time": now,
        "last_processed": now if subqueue in ("X", "F", "R") else None,
        "retry_count": 3 if subqueue == "F" else (1 if subqueue == "R" else 0),
        "retry_time": retry_time or now,
        "error_info": error_info,
        "correlation_id": f"corr-{n}",
        "label": f"PlaceOrder #{n}",
        "msg_text": body if body is not None else nginn_body("Orders.PlaceOrder, Orders", OrderId=n, Customer="ACME", Lines=[{"$type": "Orders.Line, Orders", "Sku": "X-1", "Qty": 2}]),
        "msg_headers": headers if headers is not None else None,
        "unique_id": f"{n:032x}{n}",
    }


def demo_rows(queue: str, now: datetime, count: int = 20) -> list[dict[str, Any]]:
    """A mix of every state and a few rows NGinn itself could not read."""
    rows = []
    for n in range(1, count + 1):
        rows.append(nginn_row(queue, n, now - timedelta(minutes=count - n), headers=f"_NG-ReplyTo=sql://db/Sender|Tenant=acme|_NG-Seq=s{n}"))
    rows.append(nginn_row(queue, 101, now, subqueue="R", retry_time=now + timedelta(hours=2)))
    rows.append(nginn_row(queue, 102, now - timedelta(hours=1), subqueue="F", error_info=DOTNET_ERROR))
    rows.append(nginn_row(queue, 103, now - timedelta(days=1), subqueue="X"))
    rows.append(nginn_row(queue, 104, now - timedelta(hours=3), headers="_NG-TTL=" + (now - timedelta(hours=2)).strftime("%Y-%m-%d %H:%M:%S")))
    rows.append(nginn_row(queue, 105, now, headers="Filter=a=b"))  # NGinn wrote it, NGinn cannot read it
    rows.append(nginn_row(queue, 106, now, body="{not json"))
    return rows


def openjms_store(conn: sa.Connection) -> dict[str, sa.Table]:
    """An empty OpenJMS 0.7.6 store, created by OpenJMS's own script for this database."""
    from bridge.schemas import openjms as openjms_schema
    openjms_schema.create(conn)
    return openjms_schema.tables()


def openjms_destination(conn: sa.Connection, t: dict[str, sa.Table], name: str, dest_id: int, queue: bool,
                        subscribers: dict[str, int] | None = None) -> None:
    """A destination as RDBMSAdapter.addDestination writes it: a queue gets a consumer named after itself."""
    flag: Any = ("1" if queue else "0") if conn.dialect.name == "postgresql" else int(queue)
    conn.execute(t["destinations"].insert().values(name=name, isqueue=flag, destinationid=dest_id))
    consumers = {name: dest_id * 100} if queue else dict(subscribers or {})
    for consumer, cid in consumers.items():
        conn.execute(t["consumers"].insert().values(name=consumer, destinationid=dest_id, consumerid=cid, created=0))


def openjms_message(conn: sa.Connection, t: dict[str, sa.Table], message_id: str, dest_id: int, blob: bytes,
                    consumers: list[int], accepted: int = 1_141_916_400_000, expiry: int = 0, delivered: int = 0,
                    with_message_row: bool = True) -> None:
    """A persisted message and its handles, as Messages.add and MessageHandles.addMessageHandle write them."""
    if with_message_row:
        conn.execute(t["messages"].insert().values(messageid=message_id, destinationid=dest_id, priority=4,
                                                  createtime=accepted, expirytime=expiry, processed=0, messageblob=blob))
    for i, cid in enumerate(consumers):
        conn.execute(t["message_handles"].insert().values(
            messageid=message_id, destinationid=dest_id, consumerid=cid, priority=4, acceptedtime=accepted,
            sequencenumber=i, expirytime=expiry, delivered=delivered))


def biztalk_store(engine: sa.Engine, hosts: list[str], schema: str | None = None) -> dict[str, sa.Table]:
    """MessageBox tables as qbridge reads them (Microsoft publishes no DDL), created empty."""
    from bridge.schemas.biztalk import tables

    t = tables(schema, hosts)
    next(iter(t.values())).metadata.create_all(engine)
    return t


def biztalk_message(conn: sa.Connection, t: dict[str, sa.Table], context: bytes, parts: list[tuple[str, list[bytes], int]],
                    host: str | None = None, when: datetime | None = None, suspended: dict[str, Any] | None = None,
                    message_type: str | None = None) -> tuple[Any, Any]:
    """A published message: Spool row, its parts (each a list of fragments and the part size),
    and a reference in `<host>Q` (or `<host>Q_Suspended` with an InstancesSuspended row)."""
    import uuid

    message, instance = uuid.uuid4(), uuid.uuid4()
    part_ids = [uuid.uuid4() for _ in parts]
    conn.execute(t["Spool"].insert().values(
        uidMessageID=message, dtTimeStamp=when or datetime(2024, 3, 14, 9, 26, 53), nNumParts=len(parts),
        uidBodyPartID=part_ids[0], nvcBodyPartName=parts[0][0], nvcMessageType=message_type, nCounter=1, imgContext=context))
    for pid, (name, fragments, size) in zip(part_ids, parts):
        conn.execute(t["MessageParts"].insert().values(uidMessageID=message, uidPartID=pid, nvcPartName=name, nBodyPart=int(pid == part_ids[0])))
        conn.execute(t["Parts"].insert().values(uidPartID=pid, imgPart=fragments[0], nNumFragments=len(fragments), nPartSize=size))
        for n, frag in enumerate(fragments[1:], start=1):
            conn.execute(t["Fragments"].insert().values(uidPartID=pid, nFragmentNumber=n, imgFrag=frag, nFragmentSize=0))
    if host:
        if suspended is None:
            conn.execute(t[f"{host}Q"].insert().values(uidMessageID=message, uidInstanceID=instance))
        else:
            conn.execute(t[f"{host}Q_Suspended"].insert().values(uidMessageID=message, uidInstanceID=instance,
                                                                 nvcAdditionalInfo=suspended.get("info")))
            conn.execute(t["InstancesSuspended"].insert().values(uidInstanceID=instance, **{k: v for k, v in suspended.items() if k != "info"}))
    return message, instance
