"""Where the columnar lane starts to pay: a batch of n new rows delivered by the columnar lane and
by the per-row lanes, side by side, on NGinn rows, OpenJMS handles and BizTalk messages.

    python3 bench/lane_threshold.py                       # sizes 16 .. 2048, 5 rounds
    python3 bench/lane_threshold.py --sizes 64 256 1024 --repeat 9 --systems nginn
    python3 bench/lane_threshold.py --drain 200 --rows 30000   # a sync's drain by 200-row NGinn passes

The columnar lane (bridge.pipeline.columnar) has a fixed cost a batch (its Arrow calls, the
target's templates, one write a table) and saves a share of every row's cost; the per-row lanes
cost per row. Below some size the per-row lanes are faster, and a batch below its source's
`lane_min_rows` takes them. Each timing is a whole `_deliver` of the batch: the ledger lookup,
the lane or the per-row lanes, the write of the transport rows and the ledger's record, in a
target transaction that is rolled back, so the next round delivers the same rows again. Both
lanes run in the same round, alternately, and each size reports the best of its rounds (this
machine drifts). The crossover printed is the smallest size from which the columnar lane is the
faster at that size and at every larger one measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_here = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", _here / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


migrate, scan, biztalk = _load("migrate"), _load("scan_scale"), _load("biztalk_sync")


def nginn(url: str, work: Path, most: int) -> tuple[Path, Any]:
    migrate.seed_queue(url, most)
    (work / "mapping.toml").write_text(migrate.MAPPING)
    migrate.fresh_target(url, work, migrate.TGT)
    return work / f"{migrate.TGT}.toml", lambda source, conn, n: source.fetch_after(conn, 0, n, False)


def _init(cfg: Path, work: Path) -> None:
    subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(cfg)], cwd=work, check=True, stdout=subprocess.DEVNULL)


def _scan_rows(source: Any, conn: Any, n: int) -> Any:
    """A scan source's first `n` rows in its walk's order (OpenJMS, BizTalk)."""
    keys = [k for k, _ in itertools.islice(source.iter_aged(conn), n)]
    return source.fetch_keys(conn, keys, False)


def openjms(url: str, work: Path, most: int) -> tuple[Path, Any]:
    print(f"seeding {most:,} OpenJMS handles ...", flush=True)
    scan.seed(url, most)
    (work / "mapping.toml").write_text(scan.MAPPING)
    cfg = work / "scan.toml"
    cfg.write_text(scan.CONFIG.format(pg=url, src=scan.SRC, tgt=scan.TGT))
    migrate.sql(url, f'DROP SCHEMA IF EXISTS "{scan.TGT}" CASCADE', f'CREATE SCHEMA "{scan.TGT}"')
    _init(cfg, work)
    return cfg, _scan_rows


def biztalk_store(url: str, work: Path, most: int) -> tuple[Path, Any]:
    import sqlalchemy as sa

    print(f"seeding {most:,} BizTalk messages ...", flush=True)
    engine = sa.create_engine(url)
    biztalk.seed(engine, most)
    engine.dispose()
    (work / "mapping.toml").write_text('[routes]\n"*" = "Orders"\n')
    cfg = work / "bt.toml"
    cfg.write_text(biztalk.CONFIG.format(pg=url, host=biztalk.HOST, src=biztalk.SRC, tgt=biztalk.TGT))
    _init(cfg, work)
    return cfg, _scan_rows


SYSTEMS = {"nginn": nginn, "openjms": openjms, "biztalk": biztalk_store}


def measure(cfg: Path, fetch: Any, sizes: list[int], repeat: int) -> dict[int, tuple[float, float]]:
    """size -> (best columnar seconds, best per-row seconds) of one batch's `_deliver`."""
    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    from bridge.pipeline.stats import PassStats

    config = load_config(cfg)
    runner = JobRunner(config, config.jobs[0])
    runner.check()
    runner.lane_min_rows = 1  # every batch may take the lane: columnar=False alone turns it off
    queue = next(iter(runner.sources))
    source = runner.sources[queue]
    out: dict[int, tuple[float, float]] = {}

    def deliver(rows: Any) -> float:
        with runner.target_engine.connect() as tconn:
            tx = tconn.begin()
            started = time.perf_counter()
            stats = PassStats(queue)
            runner._deliver(tconn, source, rows, False, stats, None)
            took = time.perf_counter() - started
            tx.rollback()
        if stats.delivered + stats.skipped != len(rows):
            sys.exit(f"{len(rows)} rows: {stats.delivered} delivered and {stats.skipped} skipped")
        return took

    for n in sizes:
        with runner.source_engine.connect() as sconn:
            rows = fetch(source, sconn, n)
        best = {True: float("inf"), False: float("inf")}
        reps = max(2, 1500 // n)  # a few hundred milliseconds a round and lane
        for _ in range(repeat):
            for columnar in (True, False):
                runner.columnar = columnar
                deliver(rows)  # warm
                best[columnar] = min(best[columnar], min(deliver(rows) for _ in range(reps)))
        out[n] = (best[True], best[False])
        print(f"  {n:6,} rows: columnar {best[True] * 1e3:7.2f} ms, per-row {best[False] * 1e3:7.2f} ms, "
              f"per-row/columnar {best[False] / best[True]:.2f}", flush=True)
    return out


def drain(url: str, work: Path, batch: int, rows: int, repeat: int) -> None:
    """A drain (sync --once's passes) of `rows` NGinn rows by `batch`-row passes on a fresh target
    each time, with the lane from 64 new rows on (every source's threshold before 93d50cc) and
    with NGinn's own, alternately; best of `repeat`."""
    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner

    migrate.seed_queue(url, rows)
    (work / "mapping.toml").write_text(migrate.MAPPING)
    migrate.BATCH[0] = batch
    best: dict[int | None, tuple[float, float]] = {}
    for _ in range(repeat):
        for least in (64, None):
            migrate.fresh_target(url, work, migrate.TGT)
            config = load_config(work / f"{migrate.TGT}.toml")
            runner = JobRunner(config, config.jobs[0])
            runner.check()
            runner.lane_min_rows = least
            started, cpu = time.perf_counter(), time.process_time()
            moved = runner.drain(next(iter(runner.sources))).read
            took = (time.perf_counter() - started, time.process_time() - cpu)
            if moved != rows:
                sys.exit(f"drained {moved} of {rows} rows")
            best[least] = min(best.get(least, took), took)
            runner.source_engine.dispose()
            runner.target_engine.dispose()
    for least, (wall, cpu) in best.items():
        label = "from 64 rows" if least else f"from NGinn's own {_nginn_least()} rows"
        print(f"  lane {label}: {wall:.2f} s, {rows / wall:,.0f} rows/s, {cpu:.2f} CPU-s")
    print(f"own threshold / from 64 (rows/s): {best[64][0] / best[None][0]:.2f}")


def _nginn_least() -> int:
    from bridge.sources.nginn import NGinnSource

    return NGinnSource.lane_min_rows


def crossover(results: dict[int, tuple[float, float]]) -> int | None:
    """The smallest size from which the columnar lane is faster at it and every larger size."""
    found = None
    for n in sorted(results, reverse=True):
        columnar, per_row = results[n]
        if columnar >= per_row:
            break
        found = n
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 2048])
    p.add_argument("--repeat", type=int, default=5, metavar="R", help="rounds a size (best of R)")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", migrate.PG))
    p.add_argument("--drain", type=int, metavar="B", help="instead: a drain of --rows NGinn rows by B-row passes, "
                   "with the lane from 64 rows on and from NGinn's own threshold")
    p.add_argument("--rows", type=int, default=30_000, help="rows of --drain's queue (default %(default)s)")
    args = p.parse_args()
    if args.drain:
        with tempfile.TemporaryDirectory(prefix="qbridge-lane-") as tmp:
            drain(args.pg, Path(tmp), args.drain, args.rows, args.repeat)
        migrate.sql(args.pg, *(f'DROP SCHEMA IF EXISTS "{s}" CASCADE' for s in (migrate.SRC, migrate.TGT)))
        return
    from bridge.sources import source_class

    with tempfile.TemporaryDirectory(prefix="qbridge-lane-") as tmp:
        for system in args.systems:
            work = Path(tmp) / system
            work.mkdir()
            cfg, fetch = SYSTEMS[system](args.pg, work, max(args.sizes))
            print(f"{system} (its lane_min_rows now: {source_class(system).lane_min_rows}):", flush=True)
            at = crossover(measure(cfg, fetch, sorted(args.sizes), args.repeat))
            print(f"{system}: the columnar lane is the faster from {at:,} rows on" if at else
                  f"{system}: the columnar lane is not the faster at the largest size measured", flush=True)
    migrate.sql(args.pg, *(f'DROP SCHEMA IF EXISTS "{s}" CASCADE' for s in (migrate.SRC, migrate.TGT, scan.SRC, scan.TGT, biztalk.SRC, biztalk.TGT)))


if __name__ == "__main__":
    main()
