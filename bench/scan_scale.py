"""Scan sources at scale: `migrate`, `sync --once` and `verify` on an OpenJMS store with millions
of pending handles, with the peak RSS of qbridge's Python processes at each size.

    python3 bench/scan_scale.py                      # 200k and 2M handles
    python3 bench/scan_scale.py --handles 500000
    python3 bench/scan_scale.py --drain --handles 50000 200000  # sync --once alone, on a fresh target

OpenJMS handles have no increasing key: every pass walks them. qbridge walks them streamed in
chunks (passes, verify), and the Spark engine cuts them into slices between sort tuples the
database picks, so the driver holds slice boundaries, never the keys. The goal (issue 12): peak
RSS at 2M within 20% of that at 200k, every handle delivered once, verify balanced.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PG, libpq, timed = bench.PG, bench.libpq, bench.timed
SRC, TGT = "qscan_src", "qscan_tgt"
FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "openjms" / "text_simple.bin"
MAPPING = '[routes]\n"orders" = "Orders"\n"*" = "Orders"\n'
CONFIG = """
[connections]
jms = "{pg}"
nsb = "{pg}"
[[jobs]]
name = "scan"
source = {{ system = "openjms", connection = "jms", queues = ["orders"], schema = "{src}" }}
target = {{ connection = "nsb", flavor = "postgresql", schema = "{tgt}" }}
mapping = "mapping.toml"
batch_size = 2000
"""


def seed(url: str, n: int) -> None:
    """An OpenJMS store (its own create script) with queue `orders` and n pending handles."""
    from bridge.schemas import openjms as openjms_schema
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SRC}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{SRC}"')
        conn.execute(f'SET search_path TO "{SRC}"')
        for statement in openjms_schema.SCRIPTS["postgresql"].split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO system_data VALUES (1, %s, current_date)", (openjms_schema.SCHEMA_VERSION,))
        conn.execute("INSERT INTO destinations VALUES ('orders', '1', 1)")
        conn.execute("INSERT INTO consumers VALUES ('orders', 1, 100, 0)")
        conn.execute("INSERT INTO messages SELECT 'ID:bench-' || g, 1, 4, 1141916400000 + g, 0, 0, %s "
                     "FROM generate_series(1, %s) g", (FIXTURE.read_bytes(), n))
        conn.execute("INSERT INTO message_handles SELECT 'ID:bench-' || g, 1, 100, 4, 1141916400000 + g / 3, g, 0, 0 "
                     "FROM generate_series(1, %s) g", (n,))
        conn.execute("ANALYZE messages")
        conn.execute("ANALYZE message_handles")


def io_line(url: str, n: int) -> str:
    """Blocks a handle that PostgreSQL read from outside its shared buffers (the OS cache or the
    disk), and found in them, by table and by its indexes, since the schemas were made: where the
    database's work per handle grows with the size of the store."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT schemaname || '.' || relname, coalesce(heap_blks_read, 0), coalesce(heap_blks_hit, 0), "
            "coalesce(idx_blks_read, 0), coalesce(idx_blks_hit, 0) FROM pg_statio_user_tables "
            "WHERE schemaname IN (%s, %s) ORDER BY heap_blks_read + idx_blks_read DESC LIMIT 5", (SRC, TGT)).fetchall()
    return "           blocks a handle (read/hit, heap; index): " + "; ".join(
        f"{name} {hr / n:.2f}/{hh / n:.2f}; {ir / n:.2f}/{ih / n:.2f}" for name, hr, hh, ir, ih in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--handles", type=int, nargs="+", default=[200_000, 2_000_000])
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", PG))
    p.add_argument("--logs", type=Path, help="keep each command's log here (name-handles.log)")
    p.add_argument("--drain", action="store_true",
                   help="run only `sync --once` on a fresh target: a scheduled sync's drain of the whole backlog by passes")
    p.add_argument("--batch-size", type=int, default=2000)
    args = p.parse_args()
    py = sys.executable
    commands = [("sync", ["sync", "--once"])] if args.drain else \
        [("migrate", ["migrate"]), ("sync", ["sync", "--once"]), ("verify", ["verify", "--json"])]
    results: dict[int, dict[str, tuple[float, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="qbridge-scan-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(MAPPING)
        cfg = work / "scan.toml"
        cfg.write_text(CONFIG.format(pg=args.pg, src=SRC, tgt=TGT).replace("batch_size = 2000", f"batch_size = {args.batch_size}"))
        for n in args.handles:
            print(f"seeding {n:,} OpenJMS handles ...", flush=True)
            seed(args.pg, n)
            bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE', f'CREATE SCHEMA "{TGT}"')
            subprocess.run([py, "-m", "bridge", "init", "-c", str(cfg)], cwd=work, check=True, stdout=subprocess.DEVNULL)
            results[n] = {}
            for name, cmd in commands:
                seconds, peak, err, cpu = timed([py, "-m", "bridge", *cmd, "-c", str(cfg)], work)
                results[n][name] = (seconds, peak)
                rate = f"  {n / seconds:8,.0f} handles/s" if name == "migrate" or args.drain else ""
                print(f"  {name:8} {seconds:7.1f} s  peak RSS {peak / 2**20:6.0f} MiB{rate}", flush=True)
                # where the time goes (issue 49: the fall from 200k to 2M): CPU by process kind, per handle
                print(f"           {bench.cpu_line(seconds, cpu)}; "
                      + ", ".join(f"{k} {v / n * 1e6:.0f} µs" for k, v in cpu.items() if v >= 0.05) + " a handle", flush=True)
                if args.logs:
                    (args.logs / f"{name}-{n}.log").write_text(err)
                if name == "migrate":
                    print(io_line(args.pg, n), flush=True)
            delivered = bench.count(args.pg, f'"{TGT}"."Orders"')
            distinct = bench.count(args.pg, f'(SELECT DISTINCT headers::json->>\'NServiceBus.MessageId\' FROM "{TGT}"."Orders") d')
            print(f"  delivered {delivered:,} rows, {distinct:,} distinct message ids (expected {n:,})", flush=True)
            if delivered != n or distinct != n:
                sys.exit("not exactly once")
    if len(results) > 1:
        small, large = min(results), max(results)
        for name, _ in commands:
            print(f"peak RSS of {name} at {large:,} / at {small:,}: {results[large][name][1] / results[small][name][1]:.2f}; "
                  f"{name} handles/s at {large:,}: {large / results[large][name][0]:,.0f}" if name == "migrate" or args.drain else
                  f"peak RSS of {name} at {large:,} / at {small:,}: {results[large][name][1] / results[small][name][1]:.2f}")
    bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{SRC}" CASCADE', f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE')


if __name__ == "__main__":
    main()
