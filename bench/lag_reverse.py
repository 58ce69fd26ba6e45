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
import threading
import uuid
from typing import Any
from datetime import datetime, timezone
from pathlib import Path

import orjson
import psycopg

_spec = importlib.util.spec_from_file_location("bench_lag", Path(__file__).with_name("lag.py"))
assert _spec and _spec.loader
lag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lag)

PG, libpq = lag.PG, lag.libpq
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

    def write(conn: Any) -> list[str]:
        mids = [str(uuid.uuid4()) for _ in range(per_tx)]
        sent = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S:%f Z")
        with conn.cursor() as cur:
            cur.executemany(sql, [(uuid.uuid4(), None, orjson.dumps({
                "NServiceBus.MessageId": m, "NServiceBus.MessageIntent": "Send", "NServiceBus.TimeSent": sent,
                "NServiceBus.EnclosedMessageTypes": "Shop.Messages.OrderAccepted, Shop.Messages, Version=1.0.0.0",
                "NServiceBus.ContentType": "application/json", "NServiceBus.OriginatingEndpoint": "Shop",
            }).decode(), body) for m in mids])
        return mids

    lag.paced(url, seconds, write, committed)


def observer(url: str, arrived: dict[str, float], duplicates: list[str], stop: threading.Event) -> None:
    lag.poll(url, f'SELECT id, unique_id FROM "{LEGACY}"."{PROXY}" WHERE id > %s ORDER BY id', arrived, duplicates, stop)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=500, help="messages per second (default 500)")
    p.add_argument("--seconds", type=float, default=60, help="how long the senders send (default 60)")
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", PG))
    args = p.parse_args()

    from bridge.sources.nginn import queue_table

    committed, arrived, duplicates, held, code = lag.measure(
        args.pg, (NSB, LEGACY), queue_table(PROXY, LEGACY), MAPPING,
        CONFIG.format(pg=args.pg, nsb=NSB, legacy=LEGACY, proxy=PROXY), args.rate, args.seconds, sender, observer)
    with psycopg.connect(libpq(args.pg), autocommit=True) as conn:
        left = conn.execute(f'SELECT count(*) FROM "{NSB}"."{PROXY}"').fetchone()[0]
    lag.report(committed, arrived, duplicates, held, args.rate, code, "NServiceBus send to NGinn row",
               extra=f"left in the proxy queue {left}; ", ok=not left)
    lag.drop(args.pg, (NSB, LEGACY))


if __name__ == "__main__":
    main()
