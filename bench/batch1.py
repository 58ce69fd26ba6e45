"""A large table with `batch_size = 1` still finishes: every message its own two commits.

    python3 bench/batch1.py                     # 1M rows, qbridge migrate (Spark local[*])
    python3 bench/batch1.py --rows 20000 --engine sync

Seeds N ready NGinn rows on the local PostgreSQL, runs the engine with batch_size = 1, then
checks that every row arrived exactly once and that `verify` balances, and prints the time,
batches per second and the peak RSS of the Python processes. There is no reference to compare
with: the question is whether it finishes, and how long one-row batches take.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import psycopg

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--engine", choices=["migrate", "sync"], default="migrate")
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", bench.PG))
    args = p.parse_args()

    url = args.pg
    bench.seed_queue(url, args.rows, bench.SEED.replace("WHEN g %% 10 < 7 THEN 'I'", "WHEN true THEN 'I'"))
    with tempfile.TemporaryDirectory(prefix="qbridge-batch1-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(bench.MAPPING)
        bench.fresh_target(url, work, bench.TGT)
        cfg = work / f"{bench.TGT}.toml"
        cfg.write_text(cfg.read_text().replace("batch_size = 2000", "batch_size = 1"))
        cmd = [sys.executable, "-m", "bridge.cli", *(["migrate"] if args.engine == "migrate" else ["sync", "--once"]), "-c", str(cfg)]
        seconds, peak, _, _ = bench.timed(cmd, work)
        verified = bench.subprocess.run([sys.executable, "-m", "bridge.cli", "verify", "-c", str(cfg)], cwd=work,
                                        capture_output=True).returncode
    with psycopg.connect(bench.libpq(url)) as conn:
        rows, distinct = conn.execute(
            f'SELECT count(*), count(DISTINCT headers::json->>\'NServiceBus.MessageId\') FROM "{bench.TGT}"."Orders"').fetchone()
    print(f"{args.engine} with batch_size = 1: {args.rows:,} rows in {seconds:,.0f} s = {args.rows / seconds:,.0f} batches/s; "
          f"peak RSS {peak / 2**20:,.0f} MiB")
    print(f"target rows {rows:,}, distinct message ids {distinct:,}; verify exit {verified}; "
          f"{'finished exactly once' if rows == distinct == args.rows and verified == 0 else 'NOT exactly once'}")
    bench.sql(url, f'DROP SCHEMA IF EXISTS "{bench.SRC}" CASCADE', f'DROP SCHEMA IF EXISTS "{bench.TGT}" CASCADE')


if __name__ == "__main__":
    main()
