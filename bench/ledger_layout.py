"""What the ledger's layout costs PostgreSQL, for a decision the ledger schema needs: the same
ledger entries (qbridge's message ids, random order) COPYed in batches into the ledger as
`state_tables` defines it and into variants, alternating batch by batch:
  as is           varchar(36) primary key, index (job, queue, outcome)
  no job index    the same without the (job, queue, outcome) index
  uuid key        message_id as uuid, with the index
  uuid, no index  both
  origin key      primary key (origin, source_key), where origin is a bigint naming the source
                  queue (a hash of system/database/queue, the message id's own coordinates less
                  the key); message_id kept, not indexed; with the job index
  origin, no index  the same without the job index

A message id is a hash, so the present key puts every entry on a random page of the primary
key; a source's keys mostly grow, so (origin, source_key) puts a batch's entries side by side.

    python3 bench/ledger_layout.py              # 1M entries in batches of 2,000

Prints each variant's time (client and database, commit included) and its ratio to the ledger as
it is. A probe (the ledger is kept as it is until that decision), not a goal benchmark.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import psycopg
import sqlalchemy as sa

from bridge.model import message_ids
from bridge.state import LEDGER_COLUMNS, state_tables

from copy_probe import libpq, probe_args, timed_copy  # bench/ is the script's own directory

SCHEMA = "qbench_ledger"
VARIANTS = {"as is": ("varchar(36)", True), "no job index": ("varchar(36)", False),
            "uuid key": ("uuid", True), "uuid, no index": ("uuid", False),
            "origin key": ("origin", True), "origin, no index": ("origin", False)}
ORIGIN = -4_611_686_018_427_387_904  # one source queue's origin: any constant bigint


def main() -> None:
    args = probe_args(__doc__)
    engine = sa.create_engine(args.pg)
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE'))
        conn.execute(sa.text(f'CREATE SCHEMA "{SCHEMA}"'))
        state_tables(SCHEMA)["ledger"].create(conn)  # "as is": exactly qbridge's DDL
    engine.dispose()
    names = {v: f"ledger_{i}" for i, v in enumerate(VARIANTS)}
    names["as is"] = "qbridge_ledger"
    with psycopg.connect(libpq(args.pg), autocommit=True) as conn:
        for variant, (key_type, indexed) in VARIANTS.items():
            if variant == "as is":
                continue
            t = names[variant]
            key, origin, pk = f"message_id {key_type} PRIMARY KEY", "", ""
            if key_type == "origin":
                key, origin, pk = "message_id varchar(36) NOT NULL", "origin bigint NOT NULL, ", ", PRIMARY KEY (origin, source_key)"
            conn.execute(f'CREATE TABLE "{SCHEMA}"."{t}" ({key}, job varchar(128) NOT NULL, queue varchar(128) NOT NULL, '
                         f'{origin}source_key varchar(200) NOT NULL, outcome varchar(12) NOT NULL, target varchar(260), '
                         f'reason varchar(500), at timestamp NOT NULL{pk})')
            if indexed:
                conn.execute(f'CREATE INDEX ON "{SCHEMA}"."{t}" (job, queue, outcome)')
        conn.execute("CHECKPOINT")
        spent = dict.fromkeys(VARIANTS, 0.0)
        at = datetime(2026, 1, 1)
        for start in range(0, args.rows, args.batch):
            keys = [str(k) for k in range(start, min(args.rows, start + args.batch))]
            ids = message_ids("nginn", "LegacyDb", "MQueue1", keys)
            for variant, (key_type, _) in VARIANTS.items():
                mids = [uuid.UUID(m) for m in ids] if key_type == "uuid" else ids
                origin = (ORIGIN,) if key_type == "origin" else ()  # the origin variants' extra first column
                key = "uuid" if key_type == "uuid" else "text"
                spent[variant] += timed_copy(conn, f'"{SCHEMA}"."{names[variant]}"', ("origin",) * len(origin) + LEDGER_COLUMNS,
                                             ("int8",) * len(origin) + (key, "text", "text", "text", "text", "text", "text", "timestamp"),
                                             ((*origin, m, "bench", "MQueue1", k, "delivered", "Orders", None, at)
                                              for m, k in zip(mids, keys)))
        conn.execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')
    for variant in VARIANTS:
        print(f"  {variant:16} {spent[variant]:6.1f} s  {args.rows / spent[variant]:9,.0f} entries/s  "
              f"{spent[variant] / spent['as is']:.2f} of the ledger as it is")


if __name__ == "__main__":
    main()
