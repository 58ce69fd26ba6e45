"""Why OpenJMS falls from 200k to 2M handles (issue 49): the database's plan, time and blocks a
handle for what a Spark slice runs per page, on stores of each size, side by side.

    python3 bench/scan_plans.py                      # 200k and 2M handles
    python3 bench/scan_plans.py --handles 500000 --pages 5

Per size it seeds the store bench/scan_scale.py seeds, fills the ledger as a migration of every
handle leaves it (one entry a handle, by SQL: no migration is run), and then, for `--pages`
pages spread over the keyset (2,000 handles each, the job's batch), runs with
EXPLAIN (ANALYZE, BUFFERS):
  page      the keyset page (`slice_page`),
  lookup    the ledger lookup of the page's keys (`ledger_lookup`),
  fetch     the page's handles, blobs and all (`fetch_keys`: destination, consumer IN, message IN),
and prints each statement's microseconds and blocks (shared hit / read) a handle, and the plans
of the last page's statements. A statement whose blocks a handle grow with the store is where the
fall is; a read is a block from outside shared_buffers (the OS cache or the disk).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa

_spec = importlib.util.spec_from_file_location("bench_scan_scale", Path(__file__).with_name("scan_scale.py"))
assert _spec and _spec.loader
scan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scan)
bench = scan.bench


def _captured(engine: sa.Engine, run: Any) -> list[tuple[str, Any]]:
    """The statements (SQL, parameters) `run()` sends through `engine`."""
    seen: list[tuple[str, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        run()
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
    return seen


def _explain(engine: sa.Engine, statements: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """The plans of the SELECTs among `statements`, run in one transaction as captured (a SET
    among them, as the ledger lookup makes, holds for the SELECTs after it)."""
    plans = []
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:
            for statement, parameters in statements:
                if not statement.lstrip().upper().startswith("SELECT"):
                    cur.execute(statement, parameters)
                    continue
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters)
                plan = cur.fetchone()[0]
                plans.append((plan if isinstance(plan, list) else json.loads(plan))[0])
        conn.rollback()
    return plans


def _tree(node: dict[str, Any], depth: int = 0) -> list[str]:
    what = node["Node Type"] + (f" using {node['Index Name']}" if "Index Name" in node else "") + \
        (f" on {node['Relation Name']}" if "Relation Name" in node else "")
    out = [(f"      {'  ' * depth}{what}: rows {node.get('Actual Rows')} x{node.get('Actual Loops')}, "
            f"hit {node.get('Shared Hit Blocks', 0)}, read {node.get('Shared Read Blocks', 0)}")]
    for child in node.get("Plans", []):
        out += _tree(child, depth + 1)
    return out


def fill_ledger(url: str, runner: Any, n: int) -> None:
    """One delivered entry a handle, as a migration of them all leaves the ledger."""
    origin = runner.origins["orders"]
    tgt = scan.TGT
    bench.sql(url, f'INSERT INTO "{tgt}".qbridge_ledger (origin, source_key, message_id, job, queue, outcome, target, at) '
                   f"SELECT {origin}, 'ID:bench-' || g || '#100', md5(g::text)::uuid::text, 'scan', 'orders', 'delivered', "
                   f"'Orders', now() FROM generate_series(1, {n}) g", f'ANALYZE "{tgt}".qbridge_ledger')


def measure(url: str, n: int, pages: int, work: Path) -> None:
    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner

    print(f"seeding {n:,} OpenJMS handles and their ledger ...", flush=True)
    scan.seed(url, n)
    bench.sql(url, f'DROP SCHEMA IF EXISTS "{scan.TGT}" CASCADE', f'CREATE SCHEMA "{scan.TGT}"')
    cfg = work / "scan.toml"
    subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(cfg)], cwd=work, check=True, stdout=subprocess.DEVNULL)
    config = load_config(cfg)
    runner = JobRunner(config, config.jobs[0])
    fill_ledger(url, runner, n)
    bench.sql(url, "CHECKPOINT")
    source = runner.sources["orders"]
    size = runner.job.batch_size
    with runner.source_engine.connect() as conn:
        cuts = source.slice_boundaries(conn, max(1, n // (pages + 1)))[:pages]
    totals: dict[str, list[float]] = {}
    last: dict[str, Any] = {}
    for after in cuts:
        with runner.source_engine.connect() as sconn, runner.target_engine.connect() as tconn:
            got: dict[str, Any] = {}
            page = _captured(runner.source_engine,
                             lambda a=after, g=got: g.update(page=source.slice_page(sconn, a, None, size)))
            keys = got["page"][0]
            lookup = _captured(runner.target_engine, lambda k=keys: runner.ledger_lookup(tconn, source, k))
            fetch = _captured(runner.source_engine, lambda k=keys: source.fetch_keys(sconn, k, False))
        # [1:]: the fetch's first statement finds the destination's id
        for name, statements in (("page", page), ("lookup", lookup), ("fetch", fetch[1:])):
            engine = runner.target_engine if name == "lookup" else runner.source_engine
            plans = _explain(engine, statements)
            for plan in plans:
                t = totals.setdefault(name, [0.0, 0.0, 0.0, 0.0])
                t[0] += plan["Execution Time"]
                t[1] += plan["Plan"].get("Shared Hit Blocks", 0)
                t[2] += plan["Plan"].get("Shared Read Blocks", 0)
                t[3] += len(keys) / len(plans)
                last[name] = plan
    print(f"  {n:,} handles, {len(cuts)} pages of {size:,}:")
    for name, (ms, hit, read, handles) in totals.items():
        print(f"    {name:7s} {ms / handles * 1000:7.1f} µs a handle, blocks a handle: hit {hit / handles:5.2f}, "
              f"read {read / handles:5.2f}", flush=True)
    for name in ("page", "lookup", "fetch"):
        print(f"    the last page's {name}:")
        print("\n".join(_tree(last[name]["Plan"])), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--handles", type=int, nargs="+", default=[200_000, 2_000_000])
    p.add_argument("--pages", type=int, default=8)
    p.add_argument("--pg", default=scan.PG)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="qbridge-plans-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(scan.MAPPING)
        (work / "scan.toml").write_text(scan.CONFIG.format(pg=args.pg, src=scan.SRC, tgt=scan.TGT))
        for n in args.handles:
            measure(args.pg, n, args.pages, work)
    bench.sql(args.pg, f'DROP SCHEMA IF EXISTS "{scan.SRC}" CASCADE', f'DROP SCHEMA IF EXISTS "{scan.TGT}" CASCADE')


if __name__ == "__main__":
    main()
