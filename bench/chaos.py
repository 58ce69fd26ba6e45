"""A chaos run with a checker (issue 29): `qbridge run` of a forward job (NGinn Orders ->
NServiceBus Orders) and a reverse job (proxy queue Sender -> NGinn Sender), both in move mode,
fed `--rate` messages a second each way for `--seconds`, while the harness at random
SIGKILLs qbridge (and starts it again), SIGSTOPs it for a while, cuts connections through
tests/pgproxy.py (bursts of COMMITs cut before the server and in doubt), and restarts
PostgreSQL (fast and immediate). Then it waits for the bridge to drain and prints, per
direction: attempted, acknowledged, delivered, lost, duplicated, recovered (a send whose commit
the feeder never heard back, found delivered), and the p99 lag (first seen by the checker minus
sent); exit 1 on any lost or duplicated message.

    python3 bench/chaos.py                       # 200 messages/s each way for 600 s
    python3 bench/chaos.py --seconds 120 --rate 50

Needs root for `pg_ctlcluster` (the PostgreSQL restarts); without it they are left out, and said so.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from nsb_endpoint import Endpoint  # noqa: E402
from pgproxy import FaultProxy  # noqa: E402
from tests.systems.test_reverse_nginn import TwoWay  # noqa: E402

from bridge.demo.samples import nginn_row  # noqa: E402

PG = os.environ.get("QBRIDGE_BENCH_PG", "postgresql+psycopg://127.0.0.1/test")
LEGACY, NSB = "qchaos_legacy", "qchaos_nsb"
TYPE = "Orders.Messages.OrderAccepted, Orders.Messages"


class Feed:
    """One direction's sends: acknowledged (the commit returned), uncertain (it raised)."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}  # id -> when it was sent
        self.acked: set[str] = set()
        self.uncertain: set[str] = set()
        self.seen: dict[str, float] = {}  # id -> when the checker first saw it delivered


def feed_forward(engine: sa.Engine, orders: sa.Table, rate: int, stop: threading.Event, f: Feed) -> None:
    n = 0
    while not stop.is_set():
        tick = time.monotonic()
        now = sa_now()
        rows = []
        for _ in range(max(1, rate // 10)):
            n += 1
            row = nginn_row("Orders", n, now)
            row["unique_id"] = f"fwd-{n}"
            rows.append(row)
        ids = [r["unique_id"] for r in rows]
        for i in ids:
            f.sent[i] = time.time()
        try:
            with engine.begin() as conn:
                conn.execute(orders.insert(), rows)
            f.acked.update(ids)
        except sa.exc.SQLAlchemyError:
            f.uncertain.update(ids)
        time.sleep(max(0.0, tick + 0.1 - time.monotonic()))


def feed_reverse(ep: Endpoint, rate: int, stop: threading.Event, f: Feed) -> None:
    while not stop.is_set():
        tick = time.monotonic()
        for _ in range(max(1, rate // 10)):
            headers = ep.headers(TYPE, "Send")
            mid = headers["NServiceBus.MessageId"]
            f.sent[mid] = time.time()
            try:
                ep.send(ep.address("Sender"), headers, b'{"OrderId":1}')
                f.acked.add(mid)
            except sa.exc.SQLAlchemyError:
                f.uncertain.add(mid)
        time.sleep(max(0.0, tick + 0.1 - time.monotonic()))


def sa_now():
    from datetime import datetime
    from zoneinfo import ZoneInfo

    return datetime.now(ZoneInfo("Europe/Warsaw")).replace(tzinfo=None, microsecond=0)


def check(engine: sa.Engine, tw: TwoWay, stop: threading.Event, fwd: Feed, rev: Feed) -> None:
    """Reads what arrived, incrementally, noting when each id was first seen (for the lag)."""
    marks = {"fwd": 0, "rev": 0}
    while not stop.is_set():
        try:
            with engine.connect() as conn:
                for seq, headers in conn.execute(sa.text(f'SELECT seq, headers FROM "{NSB}"."Orders" WHERE seq > :m ORDER BY seq'),
                                                 {"m": marks["fwd"]}):
                    marks["fwd"] = seq
                    uid = orjson.loads(headers).get("NGinn.UniqueId")
                    fwd.seen.setdefault(uid, time.time())
                for rid, uid in conn.execute(sa.select(tw.sender.c.id, tw.sender.c.unique_id).where(tw.sender.c.id > marks["rev"])
                                             .order_by(tw.sender.c.id)):
                    marks["rev"] = rid
                    rev.seen.setdefault(uid, time.time())
        except sa.exc.SQLAlchemyError:
            pass  # PostgreSQL restarting: read again in a moment
        time.sleep(0.5)


class Bridge:
    def __init__(self, config: Path, work: Path) -> None:
        self.config, self.work, self.proc = config, work, None
        self.log = (work / "run.log").open("ab")

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(self.config)], cwd=self.work,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def chaos(bridge: Bridge, proxy: FaultProxy, stop: threading.Event, restarts: bool, counts: dict) -> None:
    rng = random.Random(5)
    actions = ["kill", "pause", "cut"] + (["restart-fast", "restart-immediate"] if restarts else [])
    while not stop.wait(rng.uniform(5, 15)):
        action = rng.choice(actions)
        counts[action] = counts.get(action, 0) + 1
        if action == "kill":
            bridge.kill()
            time.sleep(rng.uniform(0.5, 3))
            bridge.start()
        elif action == "pause":
            os.kill(bridge.proc.pid, signal.SIGSTOP)
            time.sleep(rng.uniform(2, 15))
            os.kill(bridge.proc.pid, signal.SIGCONT)
        elif action == "cut":
            proxy.cut_before_commit = proxy.cut_after_commit = 0.2
            time.sleep(rng.uniform(5, 10))
            proxy.cut_before_commit = proxy.cut_after_commit = 0.0
        else:
            version = sorted(os.listdir("/etc/postgresql"))[0]
            mode = action.split("-")[1]
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", mode],
                           check=True, capture_output=True)


def report(name: str, f: Feed, delivered: dict[str, int]) -> bool:
    lost = [i for i in f.acked if delivered.get(i, 0) == 0]
    dup = [i for i, n in delivered.items() if n > 1]
    recovered = [i for i in f.uncertain if delivered.get(i)]
    lags = sorted(f.seen[i] - f.sent[i] for i in f.seen if i in f.sent)
    p99 = lags[int(len(lags) * 0.99) - 1] if lags else float("nan")
    print(f"{name}: attempted {len(f.sent):,}, acknowledged {len(f.acked):,}, delivered {sum(1 for n in delivered.values() if n):,}, "
          f"lost {len(lost)}, duplicated {len(dup)}, recovered {len(recovered)} (of {len(f.uncertain)} unacknowledged), "
          f"p99 lag {p99:.1f} s")
    return not lost and not dup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=200, help="messages a second each way (default 200)")
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--no-restarts", action="store_true", help="leave PostgreSQL restarts out (other work uses the server)")
    args = p.parse_args()
    restarts = shutil.which("pg_ctlcluster") is not None and os.geteuid() == 0 and not args.no_restarts
    if not restarts:
        print("PostgreSQL restarts left out" + ("" if args.no_restarts else ": they need pg_ctlcluster as root"))
    engine = sa.create_engine(PG, pool_pre_ping=True)
    with engine.begin() as conn:
        for s in (LEGACY, NSB):
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{s}" CASCADE'))
            conn.execute(sa.text(f'CREATE SCHEMA "{s}"'))
    proxy = FaultProxy(seed=3).start()
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="qbridge-chaos-") as tmp:
        work = Path(tmp)
        tw = TwoWay(work, PG, LEGACY, NSB)
        tw.engine = engine
        tw.endpoint = Endpoint(engine, NSB, "Orders")
        tw.write_config(batch_size=200, schedule='schedule = { every = "1s" }')
        assert tw.cli("init") == 0
        tw.config.write_text(tw.config.read_text().replace(f'"{PG}"', f'"{proxy.url()}"'))
        fwd, rev = Feed(), Feed()
        stop_feed, stop_chaos, stop_check = threading.Event(), threading.Event(), threading.Event()
        bridge = Bridge(tw.config, work)
        bridge.start()
        threads = [threading.Thread(target=feed_forward, args=(engine, tw.orders, args.rate, stop_feed, fwd)),
                   threading.Thread(target=feed_reverse, args=(tw.endpoint, args.rate, stop_feed, rev)),
                   threading.Thread(target=chaos, args=(bridge, proxy, stop_chaos, restarts, counts)),
                   threading.Thread(target=check, args=(engine, tw, stop_check, fwd, rev))]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop_feed.set()
        stop_chaos.set()
        threads[2].join()
        if bridge.proc.poll() is not None:
            bridge.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # drained: nothing waiting on either side
            with engine.connect() as conn:
                left = conn.execute(sa.select(sa.func.count()).select_from(tw.orders).where(tw.orders.c.subqueue == "I")).scalar_one()
                left += conn.execute(sa.text(f'SELECT count(*) FROM "{NSB}"."Sender"')).scalar_one()
            if not left:
                break
            time.sleep(2)
        time.sleep(2)
        stop_check.set()
        threads[3].join()
        os.kill(bridge.proc.pid, signal.SIGTERM)
        bridge.proc.wait(60)
        with engine.connect() as conn:
            fwd_got: dict[str, int] = {}
            for (headers,) in conn.execute(sa.text(f'SELECT headers FROM "{NSB}"."Orders"')):
                uid = orjson.loads(headers).get("NGinn.UniqueId")
                fwd_got[uid] = fwd_got.get(uid, 0) + 1
            rev_got: dict[str, int] = {}
            for (uid,) in conn.execute(sa.select(tw.sender.c.unique_id)):
                rev_got[uid] = rev_got.get(uid, 0) + 1
        print(f"chaos over {args.seconds:.0f} s at {args.rate}/s each way: {counts}; proxy: {dict(proxy.counts)}")
        ok = report("forward (NGinn -> NServiceBus)", fwd, fwd_got) & report("reverse (NServiceBus -> NGinn)", rev, rev_got)
    proxy.stop()
    with engine.begin() as conn:
        for s in (LEGACY, NSB):
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{s}" CASCADE'))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
