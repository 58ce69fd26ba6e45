"""What the ledger's layout costs PostgreSQL: the same ledger entries (qbridge's message ids, keys
in source order) COPYed in batches into the ledger as `state_tables` defines it and into the
layouts it was chosen over, alternating batch by batch:
  as is           primary key (origin, source_key): origin a bigint naming the source queue (a
                  hash of system/database/queue, the message id's coordinates less the key);
                  message_id kept, not indexed
  origin + index  the same with an index (job, queue, outcome)
  earlier         message_id varchar(36) primary key and that index (qbridge before the origin key)
  id key          message_id varchar(36) primary key, no index
  uuid key        message_id uuid primary key, no index

A message id is a hash, so keying by it puts every entry on a random page of the key's index; a
source's keys mostly grow, so (origin, source_key) puts a batch's entries side by side.

    python3 bench/ledger_layout.py              # 1M entries in batches of 2,000

Prints each layout's time (client and database, commit included) and its ratio to the ledger as
it is. A probe, not a goal benchmark.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import psycopg
import sqlalchemy as sa

from bridge.model import message_ids
from bridge.state import state_tables

from copy_probe import libpq, probe_args, timed_copy  # bench/ is the script's own directory

SCHEMA = "qbench_ledger"
# layout -> (message id's type, keyed by origin, with the job index)
VARIANTS = {"as is": ("text", True, False), "origin + index": ("text", True, True), "earlier": ("text", False, True),
            "id key": ("text", False, False), "uuid key": ("uuid", False, False)}
ORIGIN = -4_611_686_018_427_387_904  # one source queue's origin: any constant bigint
REST = ("job", "queue", "outcome", "target", "reason", "at")


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
        for variant, (id_type, by_origin, indexed) in VARIANTS.items():
            if variant == "as is":
                continue
            t = names[variant]
            key = ("origin bigint NOT NULL, message_id varchar(36) NOT NULL" if by_origin
                   else f"message_id {'uuid' if id_type == 'uuid' else 'varchar(36)'} PRIMARY KEY")
            conn.execute(f'CREATE TABLE "{SCHEMA}"."{t}" ({key}, job varchar(128) NOT NULL, queue varchar(128) NOT NULL, '
                         'source_key varchar(200) NOT NULL, outcome varchar(12) NOT NULL, target varchar(260), '
                         f'reason varchar(500), at timestamp NOT NULL{", PRIMARY KEY (origin, source_key)" if by_origin else ""})')
            if indexed:
                conn.execute(f'CREATE INDEX ON "{SCHEMA}"."{t}" (job, queue, outcome)')
        conn.execute("CHECKPOINT")
        spent = dict.fromkeys(VARIANTS, 0.0)
        at = datetime(2026, 1, 1)
        for start in range(0, args.rows, args.batch):
            keys = [str(k) for k in range(start, min(args.rows, start + args.batch))]
            ids = message_ids("nginn", "LegacyDb", "MQueue1", keys)
            for variant, (id_type, by_origin, _) in VARIANTS.items():
                mids = [uuid.UUID(m) for m in ids] if id_type == "uuid" else ids
                origin = (ORIGIN,) if by_origin else ()  # the origin layouts' extra first column
                spent[variant] += timed_copy(conn, f'"{SCHEMA}"."{names[variant]}"',
                                             ("origin",) * len(origin) + ("message_id", "source_key") + REST,
                                             ("int8",) * len(origin) + (id_type, "text", "text", "text", "text", "text", "text", "timestamp"),
                                             ((*origin, m, k, "bench", "MQueue1", "delivered", "Orders", None, at)
                                              for m, k in zip(mids, keys)))
        conn.execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')
    for variant in VARIANTS:
        print(f"  {variant:16} {spent[variant]:6.1f} s  {args.rows / spent[variant]:9,.0f} entries/s  "
              f"{spent[variant] / spent['as is']:.2f} of the ledger as it is")


if __name__ == "__main__":
    main()
