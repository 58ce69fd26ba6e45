"""Reverse-direction lag under steady load: `qbridge run` with `every = "1s"` moving an
NServiceBus proxy queue into an NGinn queue while NServiceBus senders write into it.

    python3 bench/lag_reverse.py                  # 500 messages/s for 60 s
    python3 bench/lag_reverse.py --rate 1000 --seconds 30

A sender thread inserts into the proxy queue with the PostgreSQL transport's own send statement,
in small transactions, and records when each message's transaction committed. An observer polls
the NGinn table every 20 ms and records when each message (by `unique_id` = NServiceBus.MessageId)
became visible there. Prints p50/p99/max of (arrival - send commit), checks that every message
arrived exactly once and that the proxy queue is empty at the end. Goal: p99 under 2 s, nothing lost.
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
import uuid
from datetime import datetime, timezone
from pathlib import Path

import orjson
import psycopg
import sqlalchemy as sa

_spec = importlib.util.spec_from_file_location("bench_lag", Path(__file__).with_name("lag.py"))
assert _spec and _spec.loader
lag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lag)

PG, libpq, percentile = lag.PG, lag.libpq, lag.percentile
NSB, LEGACY, PROXY = "qlagr_nsb", "qlagr_legacy", "Sender"
MAPPING = """
[routes]
"Sender" = "Sender"
[types]
"Shop.OrderAccepted, Shop" = "Shop.Messages.OrderAccepted, Shop.Messages"
"""
CONFIG = """
[connections]
nsb    = "{pg}"
legacy = "{pg}"

[[jobs]]
name     = "to-legacy"
source   = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{nsb}", queues = ["{proxy}"] }}
target   = {{ system = "nginn", connection = "legacy", timezone = "UTC", schema = "{legacy}", alias = "db" }}
mapping  = "mapping.toml"
schedule = {{ every = "1s" }}
"""


def sender(url: str, rate: int, seconds: float, committed: dict[str, float]) -> None:
    """`rate` messages a second, in transactions of rate/20 every 50 ms, as NServiceBus sends them."""
    per_tx = max(1, rate // 20)
    body = orjson.dumps({"OrderId": 1, "Note": "x" * 400})
    sql = (f'INSERT INTO "{NSB}"."{PROXY}" (Id, Expires, Headers, Body) VALUES '
           "(%s, (now() AT TIME ZONE 'UTC') + (%s || ' ms')::INTERVAL, %s, %s)")
    with psycopg.connect(libpq(url), autocommit=False) as conn:
        start = time.monotonic()
        tick = 0
        while time.monotonic() - start < seconds:
            mids = [str(uuid.uuid4()) for _ in range(per_tx)]
            sent = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S:%f Z")
            with conn.cursor() as cur:
                cur.executemany(sql, [(uuid.uuid4(), None, orjson.dumps({
                    "NServiceBus.MessageId": m, "NServiceBus.MessageIntent": "Send", "NServiceBus.TimeSent": sent,
                    "NServiceBus.EnclosedMessageTypes": "Shop.Messages.OrderAccepted, Shop.Messages, Version=1.0.0.0",
                    "NServiceBus.ContentType": "application/json", "NServiceBus.OriginatingEndpoint": "Shop",
                }).decode(), body) for m in mids])
            conn.commit()
            at = time.time()
            for m in mids:
                committed[m] = at
            tick += 1
            pause = start + tick * 0.05 - time.monotonic()
            if pause > 0:
                time.sleep(pause)


def observer(url: str, arrived: dict[str, float], duplicates: list[str], stop: threading.Event) -> None:
    last = 0
    sql = f'SELECT id, unique_id FROM "{LEGACY}"."{PROXY}" WHERE id > %s ORDER BY id'
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(sql, (last,)).fetchall()
            at = time.time()
            for key, mid in rows:
                if mid in arrived:
                    duplicates.append(mid)
                arrived[mid] = at
                last = key
            time.sleep(0.02)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=500, help="messages per second (default 500)")
    p.add_argument("--seconds", type=float, default=60, help="how long the senders send (default 60)")
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", PG))
    args = p.parse_args()

    from bridge.sources.nginn import queue_table

    with psycopg.connect(libpq(args.pg), autocommit=True) as conn:
        for schema in (NSB, LEGACY):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{schema}"')
    engine = sa.create_engine(args.pg)
    queue_table(PROXY, LEGACY).create(engine)
    engine.dispose()
    with tempfile.TemporaryDirectory(prefix="qbridge-lagr-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(MAPPING)
        cfg = work / "lag.toml"
        cfg.write_text(CONFIG.format(pg=args.pg, nsb=NSB, legacy=LEGACY, proxy=PROXY))
        subprocess.run([sys.executable, "-m", "bridge.cli", "init", "-c", str(cfg)], check=True, stdout=subprocess.DEVNULL)
        log = open(work / "run.log", "wb")
        run = subprocess.Popen([sys.executable, "-m", "bridge.cli", "run", "-c", str(cfg)], stderr=log)
        committed: dict[str, float] = {}
        arrived: dict[str, float] = {}
        duplicates: list[str] = []
        stop = threading.Event()
        watch = threading.Thread(target=observer, args=(args.pg, arrived, duplicates, stop), daemon=True)
        watch.start()
        time.sleep(2)
        print(f"sending {args.rate} messages/s for {args.seconds:.0f} s ...", flush=True)
        started = time.monotonic()
        send = threading.Thread(target=sender, args=(args.pg, args.rate, args.seconds, committed))
        send.start()
        send.join()
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
        with psycopg.connect(libpq(args.pg), autocommit=True) as conn:
            left = conn.execute(f'SELECT count(*) FROM "{NSB}"."{PROXY}"').fetchone()[0]

    lags = [arrived[k] - t for k, t in committed.items() if k in arrived]
    lost = len(committed) - len(lags)
    print(f"messages sent {len(committed):,}; arrived {len(lags):,}; lost {lost}; doubled {len(duplicates)}; "
          f"left in the proxy queue {left}; qbridge run exit {code}")
    print(f"senders held {held:,.0f} messages/s (asked {args.rate})")
    if lags:
        print(f"lag from NServiceBus send to NGinn row: p50 {statistics.median(lags):.3f} s  "
              f"p99 {percentile(lags, 99):.3f} s  max {max(lags):.3f} s")
        met = percentile(lags, 99) < 2 and not lost and not duplicates and not left
        print(f"goal p99 < 2 s with nothing lost: {'met' if met else 'NOT met'}")
    with psycopg.connect(libpq(args.pg), autocommit=True) as conn:
        for schema in (NSB, LEGACY):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
