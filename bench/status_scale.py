"""What `qbridge status` and `verify` cost as the ledger grows (issue 27): a queue whose ledger
holds N delivered and skipped messages, at 50k and 5M by default.

    python3 bench/status_scale.py
    python3 bench/status_scale.py --sizes 50000 500000 --repeat 9

Each size gets bench/migrate.py's NGinn queue with N rows and a target in the state qbridge
leaves after delivering all of them (ledger entries, per-queue totals, the checkpoint past the
last id), written by SQL directly: the point is what reading the books costs, not moving the
rows. Timed in-process, the median of --repeat runs: `reconcile.status` (what `status --json`,
`/metrics` and the status page compute), and next to it, as the reference, the GROUP BY over
every per-message entry that status ran before the totals existed. `verify` walks the range
ledger against the source (once per size). Goal: status at 5M at most 0.05 s more than
at 50k.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from bridge.config import load_config  # noqa: E402
from bridge.model import queue_origin  # noqa: E402
from bridge.pipeline.loop import JobRunner  # noqa: E402
from bridge.lifecycle.verify import status, verify  # noqa: E402

PG, SRC, TGT, QUEUE = bench.PG, bench.SRC, "qstatus_tgt", bench.QUEUE

# The books qbridge keeps for bench/migrate.py's rows: processed ('X') rows are skipped by the
# mapping's `processed = "skip"` rule, every other row is delivered; NGinn ids are range bits
# (written by `write_ranges`). `per_message` holds the same as an entry per message, as the
# ledger did before ranges, for the reference: the GROUP BY status ran before the totals.
BOOKS = f"""
CREATE TABLE "{TGT}".per_message (LIKE "{TGT}".qbridge_ledger INCLUDING ALL);
INSERT INTO "{TGT}".per_message (origin, source_key, message_id, job, queue, outcome, target, reason, at)
SELECT %(origin)s, q.id::text, md5(q.id::text)::uuid::text, 'bench', '{QUEUE}',
       CASE WHEN q.subqueue = 'X' THEN 'skipped' ELSE 'delivered' END,
       CASE WHEN q.subqueue = 'X' THEN NULL ELSE 'Orders' END,
       CASE WHEN q.subqueue = 'X' THEN 'states.processed = "skip"' END, now()::timestamp
FROM "{SRC}"."{QUEUE}" q;
INSERT INTO "{TGT}".qbridge_totals (origin, job, queue, outcome, reason, n, at)
SELECT origin, job, queue, outcome, reason, count(*), max(at) FROM "{TGT}".per_message GROUP BY 1, 2, 3, 4, 5;
UPDATE "{TGT}".qbridge_checkpoint SET high = (SELECT max(id) FROM "{SRC}"."{QUEUE}");
ANALYZE "{TGT}".per_message;
"""
GROUP_BY = f'SELECT queue, outcome, count(*) FROM "{TGT}".per_message WHERE origin = %(origin)s AND job = \'bench\' GROUP BY 1, 2'


def write_ranges(runner: JobRunner, origin: int) -> None:
    """The range ledger of every source row, as the batches that delivered them would leave it."""
    with runner.source_engine.connect() as sconn, runner.target_engine.begin() as tconn:
        rows = sconn.exec_driver_sql(f'SELECT id, subqueue FROM "{SRC}"."{QUEUE}"')
        runner.state.ranges.mark(tconn, origin, ((i, "skipped" if sq == "X" else "delivered") for i, sq in rows))


def median_seconds(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def run_size(n: int, work: Path, repeat: int) -> tuple[float, float, float, int]:
    bench.seed_queue(PG, n)
    bench.fresh_target(PG, work, TGT)
    config = load_config(work / f"{TGT}.toml")
    runner = JobRunner(config, config.job("bench"))
    runner.check()  # creates the checkpoint row
    origin = queue_origin("nginn", "LegacyDb", QUEUE)
    print(f"writing the books of {n:,} delivered messages ...", flush=True)
    with psycopg.connect(bench.libpq(PG), autocommit=True) as conn:
        for statement in BOOKS.split(";"):
            if statement.strip():
                conn.execute(statement, {"origin": origin})
    write_ranges(runner, origin)
    books = status(runner)
    assert books["rows_moved"] + books["queues"][0]["skipped"] == n and books["backlog"] == 0, books
    status_s = median_seconds(lambda: status(runner), repeat)
    with psycopg.connect(bench.libpq(PG)) as conn:
        group_by_s = median_seconds(lambda: conn.execute(GROUP_BY, {"origin": origin}).fetchall(), repeat)
    began = time.perf_counter()
    report = verify(runner)
    verify_s = time.perf_counter() - began
    assert report.balanced, report.to_json()
    return status_s, group_by_s, verify_s, books["rows_moved"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[50_000, 5_000_000])
    p.add_argument("--repeat", type=int, default=7, help="runs of status (and of the old GROUP BY) per size; the median counts")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(bench.MAPPING)
        for n in args.sizes:
            rows.append((n, *run_size(n, work, args.repeat)))
    print(f"\n{'ledger entries':>15} {'status (s)':>11} {'old GROUP BY (s)':>17} {'verify (s)':>11}")
    for n, status_s, group_by_s, verify_s, _ in rows:
        print(f"{n:>15,} {status_s:>11.4f} {group_by_s:>17.4f} {verify_s:>11.2f}")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(f"\nstatus at {last[0]:,} minus at {first[0]:,}: {last[1] - first[1]:+.4f} s (goal: at most +0.05 s); "
              f"the old GROUP BY: {last[2] - first[2]:+.4f} s")


if __name__ == "__main__":
    main()
