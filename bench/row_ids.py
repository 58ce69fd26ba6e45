"""What the transport row id costs PostgreSQL: the same rows COPYed in batches into two
Orders-shaped tables (the PostgreSQL transport's own DDL: uuid primary key, serial Seq), one
with the hashed message ids qbridge used as row ids before (UUIDv5, random order), one with
`model.row_ids` (UUIDv7, growing), alternating batch by batch so both see the same machine.

    python3 bench/row_ids.py                    # 1M rows in batches of 2,000
    python3 bench/row_ids.py --rows 200000

Prints the database time of each and the ratio. A probe for one design choice (which id a
queue row gets), not a goal benchmark.
"""

from __future__ import annotations

import uuid

import psycopg

from bridge.model import message_ids, row_ids

from copy_probe import libpq, probe_args, timed_copy  # bench/ is the script's own directory

SCHEMA = "qbench_ids"
HEADERS = '{"NServiceBus.MessageId":"x","NServiceBus.EnclosedMessageTypes":"Shop.Messages.OrderPlaced"}' + " " * 700
BODY = b'{"$type":"Shop.Messages.OrderPlaced, Shop.Messages","OrderId":1}' + b" " * 520


def main() -> None:
    args = probe_args(__doc__)
    tables = {"hashed": "random", "row_ids": "growing"}
    with psycopg.connect(libpq(args.pg), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{SCHEMA}"')
        for t in tables:
            conn.execute(f'CREATE TABLE "{SCHEMA}"."{t}" (id uuid NOT NULL PRIMARY KEY, expires timestamp, '
                         'headers text NOT NULL, body bytea, seq serial NOT NULL UNIQUE)')
        conn.execute("CHECKPOINT")
        spent = dict.fromkeys(tables, 0.0)
        for start in range(0, args.rows, args.batch):
            n = min(args.batch, args.rows - start)
            keys = [str(k) for k in range(start, start + n)]
            ids = {"hashed": [uuid.UUID(t) for t in message_ids("nginn", "LegacyDb", "MQueue1", keys)], "row_ids": row_ids(n)}
            for t in tables:
                spent[t] += timed_copy(conn, f'"{SCHEMA}"."{t}"', ("id", "headers", "body"), ("uuid", "text", "bytea"),
                                       ((i, HEADERS, BODY) for i in ids[t]))
        conn.execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')
    for t, order in tables.items():
        print(f"  {t:8} ({order} ids)  {spent[t]:6.1f} s  {args.rows / spent[t]:9,.0f} rows/s")
    print(f"hashed / row_ids time: {spent['hashed'] / spent['row_ids']:.2f} ({args.rows:,} rows, batches of {args.batch:,})")


if __name__ == "__main__":
    main()
