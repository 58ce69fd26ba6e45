"""Steering figures (issue 38), on the local PostgreSQL, one run each:

    python3 bench/steering.py                    # all three
    python3 bench/steering.py --only rate        # rate | pressure | replay

  rate:     `sync --once` over N ready NGinn rows with `max_rate` set: the rate it kept (rows over
            the wall time of the passes, from qbridge's own summary) against max_rate.
  pressure: `qbridge run` over N ready rows with `max_target_depth`, while an endpoint takes
            rows off the destination queue more slowly than qbridge could write them: the
            deepest the queue got (sampled every 50 ms), the limit, and how long the job was held.
  replay:   10,000 messages quarantined in one group (no route), the mapping fixed, then
            `qbridge quarantine replay --group G`: its wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PG, QUEUE, libpq = bench.PG, bench.QUEUE, bench.libpq
SRC, TGT = bench.SRC, "qsteer_tgt"
ALL_READY = bench.SEED.replace("WHEN g %% 10 < 7 THEN 'I'", "WHEN true THEN 'I'")


def qbridge(work: Path, cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", *args, "-c", str(cfg)], cwd=work, capture_output=True, text=True)


def setup(url: str, work: Path, n: int, extra: str = "", mapping: str | None = None) -> Path:
    bench.seed_queue(url, n, ALL_READY)
    bench.sql(url, f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE', f'CREATE SCHEMA "{TGT}"')
    (work / "mapping.toml").write_text(mapping or bench.MAPPING)
    cfg = work / "steer.toml"
    cfg.write_text(bench.CONFIG.format(pg=url, queue=QUEUE, tz=bench.TZ, src=SRC, tgt=TGT, batch=bench.BATCH[0]) + extra)
    done = qbridge(work, cfg, "init")
    assert done.returncode == 0, done.stderr
    return cfg


def rate(url: str, work: Path, n: int, max_rate: int) -> None:
    cfg = setup(url, work, n, f'max_rate = "{max_rate}/s"\n')
    began = time.monotonic()
    done = qbridge(work, cfg, "sync", "--once")
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    moved = bench.count(url, f'"{TGT}"."Orders"')
    first = last = None
    for line in done.stderr.splitlines():  # batch lines: the time from the first batch's end to the last's
        if "rows=" in line and "delivered=" in line:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
            first = stamp if first is None else first
            last = stamp
    batches = sum(1 for line in done.stderr.splitlines() if "rows=" in line and "delivered=" in line)
    kept = (moved - moved / batches) / (last - first) if batches > 1 and last and first and last > first else float("nan")
    print(f"rate: max_rate {max_rate}/s, {moved:,} messages in {batches} batches; {took:.1f} s for the command "
          f"(start-up and backlog count included); kept {kept:,.1f} messages/s between the first and the last batch "
          f"({kept / max_rate:.3f} of max_rate)", flush=True)


def pressure(url: str, work: Path, n: int, limit: int, endpoint_rate: int) -> None:
    cfg = setup(url, work, n, f'max_target_depth = {limit}\nschedule = {{ every = "1s" }}\n')
    log = (work / "run.log").open("w+")  # a file, not a pipe: a pipe nobody reads fills and blocks the run
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(cfg)], cwd=work,
                            stdout=subprocess.DEVNULL, stderr=log, text=True)
    deepest, taken, stop = [0], [0], threading.Event()

    def endpoint() -> None:  # the transport's receive: oldest first, a row per transaction
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            next_at = time.monotonic()
            while not stop.is_set():
                taken[0] += conn.execute(f'DELETE FROM "{TGT}"."Orders" WHERE seq = (SELECT min(seq) FROM "{TGT}"."Orders")').rowcount
                next_at += 1 / endpoint_rate
                time.sleep(max(0.0, next_at - time.monotonic()))

    def sampler() -> None:
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            while not stop.is_set():
                deepest[0] = max(deepest[0], conn.execute(f'SELECT count(*) FROM "{TGT}"."Orders"').fetchone()[0])
                time.sleep(0.05)

    threads = [threading.Thread(target=endpoint, daemon=True), threading.Thread(target=sampler, daemon=True)]
    began = time.monotonic()
    for t in threads:
        t.start()
    try:
        while taken[0] < n and time.monotonic() - began < 1800:
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        log.seek(0)
        err = log.read()
        log.close()
    took = time.monotonic() - began
    status = json.loads(qbridge(work, cfg, "status", "--json").stdout)["jobs"][0]["steering"]
    holds = err.count("held: ")
    batches = err.count(" rows=")
    print(f"pressure: {n:,} messages, max_target_depth {limit:,}, endpoint {endpoint_rate}/s: deepest the queue got "
          f"{deepest[0]:,} rows ({deepest[0] / limit:.3f} of the limit); the job was held {holds} times, "
          f"{status['held_seconds']:.0f} s in all, of {took:.0f} s, in {batches:,} batches", flush=True)


def replay(url: str, work: Path, n: int) -> None:
    no_route = bench.MAPPING.replace('"MQueue1" = "Orders"\n"*"       = "Orders"\n', '"Other" = "Orders"\n')
    cfg = setup(url, work, n, mapping=no_route)
    assert qbridge(work, cfg, "sync", "--once").returncode == 0
    groups = json.loads(qbridge(work, cfg, "quarantine", "groups", "--json").stdout)["jobs"][0]["groups"]
    [group] = groups
    (work / "mapping.toml").write_text(bench.MAPPING)
    began = time.monotonic()
    done = qbridge(work, cfg, "quarantine", "replay", "--group", group["group"])
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    moved = bench.count(url, f'"{TGT}"."Orders"')
    print(f"replay: a group of {group['count']:,} quarantined messages replayed in {took:.1f} s "
          f"({moved / took:,.0f} messages/s), {moved:,} delivered", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["rate", "pressure", "replay"])
    p.add_argument("--pg", default=PG)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="qbridge-steer-") as tmp:
        work = Path(tmp)
        if args.only in (None, "rate"):
            rate(args.pg, work, 6000, 500)
        if args.only in (None, "pressure"):
            pressure(args.pg, work, 20_000, 2000, 1000)
        if args.only in (None, "replay"):
            replay(args.pg, work, 10_000)
    bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{SRC}" CASCADE', f'DROP SCHEMA IF EXISTS "{TGT}" CASCADE')


if __name__ == "__main__":
    main()
