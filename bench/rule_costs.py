"""What each kind of mapping rule (issue 47) costs a message: bench/migrate.py's NGinn rows mapped
in-process (decode, rules, envelope; no database write), under the plain mapping and under it
plus one rule kind at a time, and all of issue 47's story (bench/story_mapping.toml).

    python3 bench/rule_costs.py              # 20,000 rows, median of 5
    python3 bench/rule_costs.py --rows 50000 --repeat 3

Prints µs a message per mapping on the per-row lanes and on the columnar lane, each with its
difference from the plain mapping on the same lane.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from bridge.config import load_config  # noqa: E402
from bridge.pipeline.columnar import process_columns  # noqa: E402
from bridge.pipeline.loop import JobRunner, PassStats  # noqa: E402

RULES = {
    "type rule": "[[types.rules]]\nmatch = '^Shop\\.Messages\\.(\\w+), Shop\\.Messages$'\nto = 'Shop.Contracts.\\1, Shop.Contracts'\n",
    "route rule (header)": "[[routes.rules]]\nwhen = 'headers[\"Region\"] == \"eu-1\"'\nto = 'Orders.EU'\n",
    "skip rule (header)": "[[skip]]\nname = 't'\nwhen = '\"X-Test\" in headers && headers[\"X-Test\"] == \"true\"'\n",
    "body rule": "[[body]]\nwhen = 'type.startsWith(\"Shop.\")'\nstrip_types = true\nrename = { 'Note' = 'Remark' }\nset = { 'V' = 2 }\n",
    "headers rule": "[[headers.rules]]\nwhen = 'queue == \"MQueue1\"'\nset = { 'Acme.O' = 'Legacy.{queue}' }\nfrom_body = { 'Acme.C' = 'Customer' }\n",
    "ttbr rule": "[[ttbr]]\nwhen = 'type.startsWith(\"Shop.\")'\nset = '1.00:00:00'\n",
}


def timed(runner: JobRunner, rows: list[Any], columnar: bool, repeat: int) -> float:
    source = runner.sources[bench.QUEUE]
    times = []
    for at in range(repeat + 1):  # the first run warms up (imports, compiled rules, caches) untimed
        copies = [r._replace(values=dict(r.values)) for r in rows]
        began = time.perf_counter()
        if columnar:
            process_columns(runner, None, source, copies, False, PassStats(bench.QUEUE), {})
        else:
            runner._process(None, source, copies, False, PassStats(bench.QUEUE), {})
        if at:
            times.append(time.perf_counter() - began)
    return statistics.median(times) / len(rows) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    bench.seed_queue(bench.PG, args.rows)
    story = (ROOT / "bench" / "story_mapping.toml").read_text()
    mappings = {"plain": bench.MAPPING, **{k: bench.MAPPING + v for k, v in RULES.items()}, "issue 47's story": story}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(bench.MAPPING)
        bench.fresh_target(bench.PG, work, bench.TGT)
        config_path = work / f"{bench.TGT}.toml"
        for name, text in mappings.items():
            (work / "mapping.toml").write_text(text)
            config = load_config(config_path)
            runner = JobRunner(config, config.job("bench"))
            runner.lane_min_rows = 1
            source = runner.sources[bench.QUEUE]
            with runner.source_engine.connect() as conn:
                rows = source.fetch_after(conn, None, args.rows, False)
            results[name] = (timed(runner, rows, False, args.repeat), timed(runner, rows, True, args.repeat))
    bench.sql(bench.PG, f'DROP SCHEMA IF EXISTS "{bench.SRC}" CASCADE', f'DROP SCHEMA IF EXISTS "{bench.TGT}" CASCADE')
    row_base, lane_base = results["plain"]
    print(f"\n{'mapping':28} {'per-row µs':>11} {'+ vs plain':>11} {'lane µs':>9} {'+ vs plain':>11}")
    for name, (row, lane) in results.items():
        print(f"{name:28} {row:>11.1f} {row - row_base:>+11.1f} {lane:>9.1f} {lane - lane_base:>+11.1f}")


if __name__ == "__main__":
    main()
