"""What reading the lag costs per queue (issue 46.3), beside the backlog count status already
reads: an NGinn queue of N rows with half of them past the checkpoint, and an OpenJMS store of N
pending handles, on the local PostgreSQL; 5M by default.

    python3 bench/lag_cost.py
    python3 bench/lag_cost.py --rows 500000 --repeat 5

Prints, per source, the median seconds of the backlog count alone (the reference: what status
read before) and of the count with the oldest waiting message's time (what it reads now), and
their ratio. NGinn's lag is one index seek beside a count; OpenJMS's rides on the walk that the
count already makes, reading acceptedTime with each key.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


migrate, scan = _load("migrate"), _load("scan_scale")

from bridge.config import load_config
from bridge.pipeline.loop import JobRunner
from bridge.pipeline.waiting import backlog_of, waiting_in


def median_seconds(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        out = work()
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def measure(runner: JobRunner, repeat: int, high: int | None) -> tuple[float, float, Any]:
    source = next(iter(runner.sources.values()))
    checkpoint = type("Checkpoint", (), {"high": high})() if high is not None else None
    with runner.target_engine.connect() as tconn, runner.source_engine.connect() as sconn:
        count_s, count = median_seconds(lambda: backlog_of(runner, tconn, sconn, source, checkpoint), repeat)
        both_s, waiting = median_seconds(lambda: waiting_in(runner, tconn, sconn, source, checkpoint), repeat)
    assert waiting.rows == count, (waiting, count)
    return count_s, both_s, waiting


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    pg = migrate.PG
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(migrate.MAPPING)
        migrate.seed_queue(pg, args.rows)
        migrate.fresh_target(pg, work, "qlag_tgt")
        config = load_config(work / "qlag_tgt.toml")
        runner = JobRunner(config, config.job("bench"))
        count_s, both_s, waiting = measure(runner, args.repeat, high=args.rows // 2)
        lines.append(("nginn", count_s, both_s, waiting))
        print(f"seeding {args.rows:,} OpenJMS handles ...", flush=True)
        scan.seed(pg, args.rows)
        migrate.sql(pg, f'DROP SCHEMA IF EXISTS "{scan.TGT}" CASCADE', f'CREATE SCHEMA "{scan.TGT}"')
        (work / "scan.toml").write_text(scan.CONFIG.format(pg=pg, src=scan.SRC, tgt=scan.TGT))
        (work / "mapping.toml").write_text(scan.MAPPING)
        subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(work / "scan.toml")], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)
        config = load_config(work / "scan.toml")
        runner = JobRunner(config, config.job("scan"))
        count_s, both_s, waiting = measure(runner, args.repeat, high=None)
        lines.append(("openjms", count_s, both_s, waiting))
    migrate.sql(pg, f'DROP SCHEMA IF EXISTS "{migrate.SRC}" CASCADE', 'DROP SCHEMA IF EXISTS "qlag_tgt" CASCADE',
                f'DROP SCHEMA IF EXISTS "{scan.SRC}" CASCADE', f'DROP SCHEMA IF EXISTS "{scan.TGT}" CASCADE')
    print(f"\n{'source':8} {'waiting':>10} {'count alone (s)':>16} {'count + lag (s)':>16} {'ratio':>6}  oldest")
    for name, count_s, both_s, waiting in lines:
        print(f"{name:8} {waiting.rows:>10,} {count_s:>16.3f} {both_s:>16.3f} {both_s / count_s:>6.2f}  {waiting.oldest}")


if __name__ == "__main__":
    main()
