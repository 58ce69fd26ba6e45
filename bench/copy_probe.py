"""What the COPY probes (bench/row_ids.py, bench/ledger_layout.py) share: their arguments, and
one batch COPYed into a table in its own transaction, timed."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from migrate import PG, libpq  # noqa: F401  (bench/migrate.py's, re-exported for the probes)


def probe_args(doc: str | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", PG))
    return p.parse_args()


def timed_copy(conn: psycopg.Connection, table: str, columns: Sequence[str], types: Sequence[str],
               rows: Iterable[Sequence[Any]]) -> float:
    """Seconds to COPY `rows` (binary) into `table` and commit."""
    began = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur, \
            cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)
    return time.perf_counter() - began
