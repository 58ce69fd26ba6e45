"""Where one unit of `migrate` spends its time, without Spark: `JobRunner.run_range` over N seeded
NGinn rows (bench/migrate.py's seed) in this process, as a Spark task runs it (collector set by
bridge.pipeline.gc_policy), and again with the ledger write and then the queue-table write
switched off, so their shares show, and once with CPython's default collector settings. Each
line also gives the garbage collector's passes and time (gc.callbacks).

    python3 bench/unit_split.py                 # 100,000 rows
    python3 bench/unit_split.py --rows 200000

Not a goal benchmark (the goals are measured by bench/migrate.py against its references): a
profile aid, for deciding what to make faster.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import tempfile
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def main() -> None:
    from bridge.config import load_config
    from bridge.pipeline import gc_policy
    from bridge.pipeline.loop import JobRunner

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--pg", default=bench.PG)
    args = p.parse_args()
    url, n = args.pg, args.rows
    bench.seed_queue(url, n)
    with tempfile.TemporaryDirectory(prefix="qbridge-unit-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(bench.MAPPING)
        collector = {"passes": 0, "seconds": 0.0, "started": 0.0}

        def timed_passes(phase: str, info: dict) -> None:
            if phase == "start":
                collector["started"] = time.perf_counter()
            else:
                collector["passes"] += 1
                collector["seconds"] += time.perf_counter() - collector["started"]

        gc.callbacks.append(timed_passes)
        for label in ("everything", "without the ledger write", "without the queue-table write",
                      "everything, default collector"):
            bench.fresh_target(url, work, bench.TGT)
            config = load_config(work / f"{bench.TGT}.toml")
            runner = JobRunner(config, config.jobs[0])
            runner.check()
            gc.unfreeze()
            gc.set_threshold(700, 10, 10)  # CPython's defaults
            if label != "everything, default collector":
                gc_policy.for_batches()  # as the CLI and every Spark worker set it
            if label == "without the ledger write":
                runner.state.record = lambda *a, **k: None  # type: ignore[method-assign]
            elif label == "without the queue-table write":
                runner.target.write = lambda *a, **k: None  # type: ignore[method-assign]
            collector.update(passes=0, seconds=0.0)
            started = time.perf_counter()
            s = runner.run_range(bench.QUEUE, 0, n).stats
            seconds = time.perf_counter() - started
            print(f"  {label:31} {seconds:6.2f} s  {seconds / n * 1e6:5.1f} us/row  "
                  f"(reads {s.t_read:.2f} s, decode+map {s.t_map:.2f} s, writes+commits {s.t_write:.2f} s; "
                  f"collector {collector['passes']} passes, {collector['seconds']:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
