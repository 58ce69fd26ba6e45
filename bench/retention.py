"""A bridge running for a while keeps a bounded ledger: `qbridge run` on an OpenJMS queue in move
mode with `ledger_retention = "1m"`, fed 100 messages/s for 10 minutes (issue 27).

    python3 bench/retention.py                       # 100 messages/s, 600 s
    python3 bench/retention.py --rate 500 --seconds 300

A feeder commits a batch of messages and handles into the OpenJMS store every 100 ms; `qbridge
run` moves them (move mode deletes the handles) and prunes on its own schedule. Every 10 s the
bench reads the ledger's size and its oldest entry's age. Goal: at no time more than 2 minutes'
worth of entries (2 x 60 x rate). At the end every message must be in the target once.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

_spec = importlib.util.spec_from_file_location("bench_scan", Path(__file__).with_name("scan_scale.py"))
assert _spec and _spec.loader
scan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scan)

PG, libpq, SRC, TGT, FIXTURE = scan.PG, scan.libpq, "qret_src", "qret_tgt", scan.FIXTURE
# bench/scan_scale.py's job, in move mode, retention 1 minute, on a schedule.
CONFIG = scan.CONFIG.replace('name = "scan"', 'name = "retention"') + """mode = "move"
late_commit_window = "30s"
ledger_retention = "1m"
schedule = {{ every = "1s" }}
"""


def feed(url: str, rate: int, seconds: float, stop: threading.Event, fed: list[int]) -> None:
    """`rate` messages a second, committed every 100 ms, until `seconds` pass."""
    blob = FIXTURE.read_bytes()
    per_tick = max(1, rate // 10)
    start = time.monotonic()
    n = 0
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{SRC}"')
        tick = 0
        while not stop.is_set() and time.monotonic() - start < seconds:
            ids = [f"ID:ret-{n + i}" for i in range(per_tick)]
            with conn.transaction():
                conn.cursor().executemany("INSERT INTO messages VALUES (%s, 1, 4, %s, 0, 0, %s)",
                                          [(m, 1141916400000 + n + i, blob) for i, m in enumerate(ids)])
                conn.cursor().executemany("INSERT INTO message_handles VALUES (%s, 1, 100, 4, %s, %s, 0, 0)",
                                          [(m, 1141916400000 + n + i, n + i) for i, m in enumerate(ids)])
            n += per_tick
            fed[0] = n
            tick += 1
            time.sleep(max(0.0, start + tick / 10 - time.monotonic()))


def ledger(url: str) -> tuple[int, float | None]:
    """(entries, age of the oldest in seconds)."""
    with psycopg.connect(libpq(url)) as conn:
        n, oldest = conn.execute(f'SELECT count(*), extract(epoch FROM (now() AT TIME ZONE \'UTC\') - min(at)) '
                                 f'FROM "{TGT}".qbridge_ledger').fetchone()
    return n, None if oldest is None else float(oldest)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=100, help="messages a second (default 100)")
    p.add_argument("--seconds", type=float, default=600, help="how long to feed (default 600)")
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", PG))
    args = p.parse_args()
    scan.SRC = SRC
    scan.seed(args.pg, 0)
    scan.bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE', f'CREATE SCHEMA "{TGT}"')
    bound = 2 * 60 * args.rate
    with tempfile.TemporaryDirectory(prefix="qbridge-retention-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(scan.MAPPING)
        cfg = work / "retention.toml"
        cfg.write_text(CONFIG.format(pg=args.pg, src=SRC, tgt=TGT))
        subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(cfg)], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)
        log = (work / "run.log").open("w")
        run = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(cfg)], cwd=work, stdout=log,
                               stderr=subprocess.STDOUT)
        stop, fed = threading.Event(), [0]
        feeder = threading.Thread(target=feed, args=(args.pg, args.rate, args.seconds, stop, fed))
        feeder.start()
        worst = (0, 0.0)
        started = time.monotonic()
        try:
            while feeder.is_alive():
                time.sleep(10)
                n, age = ledger(args.pg)
                worst = max(worst, (n, age or 0.0))
                print(f"  t={time.monotonic() - started:5.0f} s  fed {fed[0]:7,}  ledger {n:6,} entries, "
                      f"oldest {age or 0:5.1f} s  (bound {bound:,})", flush=True)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with psycopg.connect(libpq(args.pg)) as conn:
                    left = conn.execute(f'SELECT count(*) FROM "{SRC}".message_handles').fetchone()[0]
                if left == 0:
                    break
                time.sleep(1)
        finally:
            stop.set()
            run.send_signal(signal.SIGTERM)
            run.wait(60)
            log.close()
        delivered = scan.bench.count(args.pg, f'"{TGT}"."Orders"')
        distinct = scan.bench.count(args.pg, f'(SELECT DISTINCT headers::json->>\'NServiceBus.MessageId\' FROM "{TGT}"."Orders") d')
        print(f"fed {fed[0]:,} messages at {args.rate}/s for {args.seconds:.0f} s; delivered {delivered:,} rows, "
              f"{distinct:,} distinct ids")
        print(f"largest ledger seen: {worst[0]:,} entries (oldest {worst[1]:.0f} s); bound 2 min x {args.rate}/s = {bound:,}: "
              f"{'met' if worst[0] <= bound else 'NOT met'} ({worst[0] / bound:.2f} of it)")
        if delivered != fed[0] or distinct != fed[0]:
            print((work / "run.log").read_text()[-3000:])
            sys.exit("not exactly once")
    scan.bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{SRC}" CASCADE', f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE')


if __name__ == "__main__":
    main()
