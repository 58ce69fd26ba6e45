"""Sync lag under steady load: `qbridge run` with `every = "1s"` while writers insert into NGinn.

    python3 bench/lag.py                       # 500 messages/s for 60 s
    python3 bench/lag.py --rate 1000 --seconds 30

A writer thread inserts into an NGinn queue table on the local PostgreSQL in small transactions
and records, per message, when its transaction committed. An observer polls the NServiceBus
table every 20 ms and records when each message became visible there. Prints p50/p99/max of
(arrival - legacy commit), the rate the writers held, and checks that every message arrived
exactly once. Goal: p99 under 2 s with nothing lost.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PG, QUEUE, MAPPING, libpq = bench.PG, bench.QUEUE, bench.MAPPING, bench.libpq
SRC, TGT = "qlag_src", "qlag_tgt"
# `qbridge run` passes every second; the writers store UTC times, so main() gives tz = "UTC".
CONFIG = bench.CONFIG + 'schedule   = {{ every = "1s" }}\n'


def paced(url: str, seconds: float, write: Any, committed: dict) -> None:
    """Calls `write(conn)` every 50 ms for `seconds`, commits, and notes when each key it
    returns was committed."""
    with psycopg.connect(libpq(url), autocommit=False) as conn:
        start = time.monotonic()
        tick = 0
        while time.monotonic() - start < seconds:
            keys = write(conn)
            conn.commit()
            at = time.time()
            for k in keys:
                committed[k] = at
            tick += 1
            pause = start + tick * 0.05 - time.monotonic()
            if pause > 0:
                time.sleep(pause)


def poll(url: str, sql: str, arrived: dict, duplicates: list, stop: threading.Event) -> None:
    """Runs `sql` (rows `(position, key)` after a position) every 20 ms and notes when each key
    became visible; a key seen twice is a duplicate."""
    last = 0
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(sql, (last,)).fetchall()
            at = time.time()
            for position, key in rows:
                if key in arrived:
                    duplicates.append(key)
                arrived[key] = at
                last = position
            time.sleep(0.02)


def writer(url: str, rate: int, seconds: float, committed: dict[int, float], done: threading.Event) -> None:
    """`rate` rows a second, in transactions of rate/20 rows every 50 ms, for `seconds`."""
    per_tx = max(1, rate // 20)
    body = '{"$type":"Shop.Messages.OrderPlaced, Shop.Messages","OrderId":1,"Note":"' + "x" * 400 + '"}'
    sql = (f'INSERT INTO "{SRC}"."{QUEUE}" (from_endpoint, to_endpoint, subqueue, insert_time, retry_count, retry_time, '
           f"msg_text, msg_headers) SELECT 'sql://db/Sender', 'sql://db/{QUEUE}', 'I', %s, 0, %s, %s, 'Tenant=acme' "
           f"FROM generate_series(1, %s) RETURNING id")

    def write(conn: Any) -> list[int]:
        now = datetime.utcnow()
        return [r[0] for r in conn.execute(sql, (now, now, body, per_tx)).fetchall()]

    paced(url, seconds, write, committed)
    done.set()


def observer(url: str, arrived: dict[int, float], duplicates: list[int], stop: threading.Event) -> None:
    """Polls the NServiceBus table by its `seq` and notes when each message became visible."""
    poll(url, f'SELECT seq, (headers::json->>\'NGinn.BusMessageId\')::bigint FROM "{TGT}"."Orders" WHERE seq > %s ORDER BY seq',
         arrived, duplicates, stop)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def measure(pg: str, schemas: tuple[str, ...], table: Any, mapping: str, config: str, rate: int, seconds: float,
            produce: Any, observe: Any) -> tuple[dict, dict, list, float, int]:
    """Fresh schemas and `table`, `qbridge init` and `qbridge run` on `config`, `produce(url, rate,
    seconds, committed)` in a thread while `observe(url, arrived, duplicates, stop)` watches the
    other side; then SIGTERM. Returns (committed, arrived, duplicates, rate held, run's exit code)."""
    with psycopg.connect(libpq(pg), autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{schema}"')
    engine = sa.create_engine(pg)
    table.create(engine)
    engine.dispose()
    with tempfile.TemporaryDirectory(prefix="qbridge-lag-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(mapping)
        cfg = work / "lag.toml"
        cfg.write_text(config)
        subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(cfg)], check=True, stdout=subprocess.DEVNULL)
        log = open(work / "run.log", "wb")
        run = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(cfg)], stderr=log)
        committed: dict = {}
        arrived: dict = {}
        duplicates: list = []
        stop = threading.Event()
        watch = threading.Thread(target=observe, args=(pg, arrived, duplicates, stop), daemon=True)
        watch.start()
        time.sleep(2)  # the scheduler's first (empty) pass and table checks
        print(f"writing {rate} messages/s for {seconds:.0f} s ...", flush=True)
        started = time.monotonic()
        write = threading.Thread(target=produce, args=(pg, rate, seconds, committed))
        write.start()
        write.join()
        held = len(committed) / (time.monotonic() - started)
        deadline = time.monotonic() + 30
        while len(arrived) < len(committed) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        watch.join()
        run.send_signal(signal.SIGTERM)
        code = run.wait(60)
        log.close()
        if code != 0:
            print((work / "run.log").read_text()[-3000:])
    return committed, arrived, duplicates, held, code


def report(committed: dict, arrived: dict, duplicates: list, held: float, rate: int, code: int, what: str,
           extra: str = "", ok: bool = True) -> None:
    lags = [arrived[k] - t for k, t in committed.items() if k in arrived]
    lost = len(committed) - len(lags)
    print(f"messages written {len(committed):,}; arrived {len(lags):,}; lost {lost}; doubled {len(duplicates)}; "
          f"{extra}qbridge run exit {code}")
    print(f"writers held {held:,.0f} messages/s (asked {rate})")
    if lags:
        print(f"lag from {what}: p50 {statistics.median(lags):.3f} s  "
              f"p99 {percentile(lags, 99):.3f} s  max {max(lags):.3f} s")
        met = percentile(lags, 99) < 2 and not lost and not duplicates and ok
        print(f"goal p99 < 2 s with nothing lost: {'met' if met else 'NOT met'}")


def drop(pg: str, schemas: tuple[str, ...]) -> None:
    with psycopg.connect(libpq(pg), autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=500, help="messages per second (default 500)")
    p.add_argument("--seconds", type=float, default=60, help="how long the writers write (default 60)")
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", PG))
    args = p.parse_args()

    from bridge.schemas.nginn import queue_table

    done = threading.Event()
    committed, arrived, duplicates, held, code = measure(
        args.pg, (SRC, TGT), queue_table(QUEUE, SRC), MAPPING,
        CONFIG.format(pg=args.pg, queue=QUEUE, tz="UTC", src=SRC, tgt=TGT, batch=bench.BATCH[0]), args.rate, args.seconds,
        lambda url, rate, seconds, c: writer(url, rate, seconds, c, done), observer)
    report(committed, arrived, duplicates, held, args.rate, code, "legacy commit to NServiceBus table")
    drop(args.pg, (SRC, TGT))


if __name__ == "__main__":
    main()
