"""How a batch of NGinn rows can come off PostgreSQL as columns (issue 49: "choose by measuring"):
the same keyset pages of 2,000 rows read by each path, interleaved, best of R rounds, in µs a
row from the query to one Arrow array a column (what the columnar lane reads).

    python3 bench/fetch_paths.py --rows 100000   # seed an NGinn table as bench/migrate.py does
    python3 bench/fetch_paths.py                 # the table seeded last
    pip install -e '.[bench]'                    # ADBC's PostgreSQL driver, for (4)

  (1) qbridge's read: SQLAlchemy Core on psycopg in the source transaction, `fetchall`, a
      Fetched (bridge.sources.fetched), each column made an Arrow array;
  (2) the same statement on the same connection's psycopg cursor (text rows), no SQLAlchemy;
  (3) (2) with psycopg's binary rows;
  (4) ADBC's PostgreSQL driver (`COPY ... TO STDOUT (FORMAT BINARY)` into Arrow, in C++), on a
      connection of its own: no move-mode row locks (FOR UPDATE SKIP LOCKED needs the source
      transaction's own connection), shown as the bound of a second connection.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import sqlalchemy as sa

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PAGE = 2000
COLUMNS = ("id", "subqueue", "insert_time", "retry_time", "retry_count", "last_processed", "correlation_id",
           "from_endpoint", "to_endpoint", "label", "unique_id", "msg_text", "msg_headers", "error_info")


def _arrow(columns: dict[str, Any]) -> int:
    return sum(len(pa.array(v)) for v in columns.values())


def by_qbridge(engine: sa.Engine, pages: list[int]) -> None:
    from bridge.schemas.nginn import queue_table
    from bridge.sources.fetched import fetched
    from bridge.sources.nginn import CONSUMABLE

    t = queue_table(bench.QUEUE, bench.SRC)
    with engine.connect() as conn:
        for after in pages:
            batch = fetched(conn.execute(sa.select(t).where(t.c.id > after).order_by(t.c.id).limit(PAGE)),
                            "id", int, "subqueue", CONSUMABLE.__contains__)
            _arrow({n: batch.column(n) for n in COLUMNS})


def _sql() -> str:
    return (f'SELECT {", ".join(COLUMNS)} FROM "{bench.SRC}"."{bench.QUEUE}" WHERE id > %s ORDER BY id LIMIT {PAGE}')


def by_cursor(url: str, pages: list[int], binary: bool) -> None:
    with psycopg.connect(bench.libpq(url)) as conn, conn.cursor(binary=binary) as cur:
        for after in pages:
            cur.execute(_sql(), (after,))
            rows = cur.fetchall()
            _arrow(dict(zip(COLUMNS, zip(*rows))))


def by_adbc(url: str, pages: list[int]) -> None:
    import adbc_driver_postgresql.dbapi as adbc

    with adbc.connect(bench.libpq(url)) as conn, conn.cursor() as cur:
        for after in pages:
            cur.execute(_sql().replace("%s", "$1"), (after,))
            cur.fetch_arrow_table()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, help="seed this many NGinn rows first (else the table bench/migrate.py left)")
    p.add_argument("--pages", type=int, default=50, help="pages of 2,000 rows a path reads a round (default 50)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--pg", default=bench.PG)
    args = p.parse_args()
    if args.rows:
        bench.seed_queue(args.pg, args.rows)
    engine = sa.create_engine(args.pg)
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(bench.QUEUE, schema=bench.SRC):
            raise SystemExit(f"no table {bench.SRC}.{bench.QUEUE} (bench/migrate.py drops it when done): run with --rows N")
        ids = [r[0] for r in conn.execute(sa.text(
            f'SELECT id FROM "{bench.SRC}"."{bench.QUEUE}" WHERE id % {PAGE} = 0 ORDER BY id LIMIT {args.pages}'))]
    pages = [i - PAGE for i in ids]
    if not pages:
        raise SystemExit(f"no rows in {bench.SRC}.{bench.QUEUE}: run with --rows N")
    paths = {"(1) qbridge: SQLAlchemy fetchall, Fetched, Arrow": lambda: by_qbridge(engine, pages),
             "(2) psycopg cursor, text rows, Arrow": lambda: by_cursor(args.pg, pages, False),
             "(3) psycopg cursor, binary rows, Arrow": lambda: by_cursor(args.pg, pages, True)}
    if importlib.util.find_spec("adbc_driver_postgresql"):
        paths["(4) ADBC, own connection (no row locks)"] = lambda: by_adbc(args.pg, pages)
    else:
        print("(4) ADBC: adbc-driver-postgresql is not installed (pip install -e '.[bench]')")
    best = {name: float("inf") for name in paths}
    for _ in range(args.repeat):
        for name, run in paths.items():
            began = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - began)
    rows = len(pages) * PAGE
    base = best[next(iter(best))]
    print(f"{len(pages)} pages of {PAGE:,} rows, best of {args.repeat}:")
    for name, seconds in best.items():
        print(f"  {name:52s} {seconds / rows * 1e6:7.2f} µs a row  ({base / seconds:4.2f}x (1))")


if __name__ == "__main__":
    main()
