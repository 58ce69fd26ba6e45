"""`qbridge sync --once` over a flaky link (issue 29): bench/migrate.py's NGinn rows moved in move
mode through tests/pgproxy.py, once with no fault and once with COMMITs cut (half before they
reach PostgreSQL, half after it committed with the answer lost: in doubt), in one run.

    python3 bench/flaky_sync.py                          # 100k rows, 1 COMMIT in 20 cut
    python3 bench/flaky_sync.py --rows 100000 --batch 10 --cut 0.06 --retries 10   # ~1,000 cuts of each kind

Prints both times and their ratio, the cuts of each kind, and checks every message arrived once
(lost 0, duplicated 0) and every source row was consumed. Goal: the faulty run within 2x of the
clean one.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pgproxy import FaultProxy  # noqa: E402

TGT = "qflaky_tgt"


def run(url: str, work: Path, proxy: FaultProxy, n: int, batch: int, cut: float, retries: int) -> tuple[float, Counter]:
    bench.seed_queue(url, n)
    bench.fresh_target(url, work, TGT)
    cfg = work / "flaky.toml"
    text = (work / f"{TGT}.toml").read_text().replace(url, proxy.url()).replace("batch_size = 2000", f"batch_size = {batch}")
    cfg.write_text(text + 'mode = "move"\n')
    proxy.counts.clear()
    proxy.cut_before_commit = proxy.cut_after_commit = cut / 2
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bridge", "sync", "--once", "--retries", str(retries), "-c", str(cfg)], cwd=work,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    proxy.cut_before_commit = proxy.cut_after_commit = 0.0
    if done.returncode != 0:
        sys.exit(f"sync failed: {done.stderr[-2000:]}")
    rows = sum(bench.count(url, f'"{TGT}"."{t}"') for t in ("Orders", "Orders.Delayed", "error"))
    distinct = bench.count(url, f'(SELECT DISTINCT headers::json->>\'NServiceBus.MessageId\' FROM ('
                                f'SELECT headers FROM "{TGT}"."Orders" UNION ALL SELECT headers FROM "{TGT}"."Orders.Delayed" '
                                f'UNION ALL SELECT headers FROM "{TGT}"."error") a) d')
    pending = bench.count(url, f'"{bench.SRC}"."{bench.QUEUE}" WHERE subqueue <> \'X\'')
    expected = n - n // 10  # processed rows are skipped
    print(f"  cut {cut:.0%} of COMMITs: {seconds:6.1f} s; {dict(proxy.counts)}; {rows:,} rows, {distinct:,} distinct ids "
          f"(expected {expected:,}), {pending:,} source rows left unconsumed", flush=True)
    if rows != expected or distinct != expected or pending:
        sys.exit(f"lost {expected - distinct}, duplicated {rows - distinct}, unconsumed {pending}")
    return seconds, Counter(proxy.counts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000, help="batch_size (default 1000)")
    p.add_argument("--cut", type=float, default=0.05, help="share of COMMITs cut, half before, half in doubt (default 0.05)")
    p.add_argument("--retries", type=int, default=6, help="sync's --retries (attempts per batch; default 6)")
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", bench.PG))
    args = p.parse_args()
    proxy = FaultProxy(seed=11).start()
    try:
        with tempfile.TemporaryDirectory(prefix="qbridge-flaky-") as tmp:
            work = Path(tmp)
            (work / "mapping.toml").write_text(bench.MAPPING)
            clean, _ = run(args.pg, work, proxy, args.rows, args.batch, 0.0, args.retries)
            faulty, counts = run(args.pg, work, proxy, args.rows, args.batch, args.cut, args.retries)
    finally:
        proxy.stop()
    print(f"\nfaulty / clean: {faulty / clean:.2f} (goal: at most 2.0); cut before the server "
          f"{counts['cut before commit']:,}, in doubt {counts['cut after commit']:,} of {counts['commits']:,} COMMITs; "
          "lost 0, duplicated 0")
    bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE', f'DROP SCHEMA IF EXISTS "{bench.SRC}" CASCADE')


if __name__ == "__main__":
    main()
