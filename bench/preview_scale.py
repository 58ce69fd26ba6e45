"""`qbridge discover` and `qbridge preview` against `qbridge migrate` on the same NGinn rows, in one
run (issue 28): bench/migrate.py's seeded queue (70% ready, 10% delayed, 10% failed, 10%
processed).

    python3 bench/preview_scale.py                  # 1M rows
    python3 bench/preview_scale.py --rows 200000

Prints the time and peak RSS of discover (counts and a 200-message sample), preview (every row
read and mapped, nothing written) and migrate (Spark `local[*]`), and preview/migrate. Goals:
discover in seconds; preview at least as fast as migrate; bounded memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

TGT = "qpreview_tgt"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", bench.PG))
    args = p.parse_args()
    py = sys.executable
    bench.class_archive_ready()
    with tempfile.TemporaryDirectory(prefix="qbridge-preview-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(bench.MAPPING)
        bench.seed_queue(args.pg, args.rows)
        bench.fresh_target(args.pg, work, TGT)
        cfg = str(work / f"{TGT}.toml")
        results = {}
        for name, cmd in (("discover", [py, "-m", "bridge", "discover", args.pg, "--schema", bench.SRC, "--json"]),
                          ("preview", [py, "-m", "bridge", "preview", "-c", cfg, "--json"]),
                          ("migrate", [py, "-m", "bridge", "migrate", "-c", cfg])):
            seconds, peak, err, cpu = bench.timed(cmd, work)
            results[name] = (seconds, peak)
            print(f"  {name:8} {seconds:7.1f} s  {args.rows / seconds:9,.0f} rows/s  peak RSS {peak / 2**20:5.0f} MiB  "
                  f"{bench.cpu_line(seconds, cpu)}", flush=True)
        delivered = sum(bench.count(args.pg, f'"{TGT}"."{t}"') for t in ("Orders", "Orders.Delayed", "error"))
        if delivered != args.rows - args.rows // 10:
            sys.exit(f"migrate moved {delivered} rows")
    print(f"\npreview / migrate (time): {results['preview'][0] / results['migrate'][0]:.2f} (goal: at most 1.0); "
          f"discover {results['discover'][0]:.1f} s at {args.rows:,} rows")
    bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE', f'DROP SCHEMA IF EXISTS "{bench.SRC}" CASCADE')


if __name__ == "__main__":
    main()
