"""BizTalk read throughput: `qbridge sync --once` over N pending work-queue entries (real context
and part blobs from tests/fixtures/biztalk) on the local PostgreSQL, once with the pure-Python
readers (QBRIDGE_COMPILED_READERS=0, the reference of issue 49) and once with the compiled ones,
on a store seeded anew for each; prints both rates and their ratio. Issue 49's goal: at least
10,000 messages/s.

    python3 bench/biztalk_sync.py               # 20,000 messages
    python3 bench/biztalk_sync.py --messages 100000 --only compiled
    python3 bench/biztalk_sync.py --messages 100000 --only compiled --batch-size 10000   # a backlog's drain
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa

from bridge.demo.samples import biztalk_store

_spec = importlib.util.spec_from_file_location("bench_migrate", Path(__file__).with_name("migrate.py"))
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PG = "postgresql+psycopg://127.0.0.1/test"
FIX = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "biztalk"
SRC, TGT, HOST = "qbt_src", "qbt_tgt", "BizTalkServerApplication"
CONFIG = """
[connections]
bt = "{pg}"
nsb = "{pg}"
[[jobs]]
name = "bt"
source = {{ system = "biztalk", connection = "bt", queues = ["{host}"], schema = "{src}", timezone = "UTC" }}
target = {{ connection = "nsb", flavor = "postgresql", schema = "{tgt}" }}
mapping = "mapping.toml"
batch_size = 1000
"""


def seed(engine: sa.Engine, n: int, vacuum: bool = False) -> None:
    context, part = (FIX / "ctx_receive.bin").read_bytes(), (FIX / "part_small_compressed.bin").read_bytes()
    with engine.begin() as conn:
        for schema in (SRC, TGT):
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    t = biztalk_store(engine, [HOST], SRC)
    ids = [(uuid.uuid4(), uuid.uuid4(), uuid.uuid4()) for _ in range(n)]
    with engine.begin() as conn:
        conn.execute(t["Spool"].insert(), [dict(uidMessageID=m, nNumParts=1, uidBodyPartID=p, nvcBodyPartName="body",
                                                nCounter=1, imgContext=context) for m, _, p in ids])
        conn.execute(t["MessageParts"].insert(), [dict(uidMessageID=m, uidPartID=p, nvcPartName="body", nBodyPart=1) for m, _, p in ids])
        conn.execute(t["Parts"].insert(), [dict(uidPartID=p, imgPart=part, nNumFragments=1, nPartSize=2146) for _, _, p in ids])
        conn.execute(t[f"{HOST}Q"].insert(), [dict(uidMessageID=m, uidInstanceID=i) for m, i, _ in ids])
        for name in ("Spool", "MessageParts", "Parts", f"{HOST}Q"):
            conn.execute(sa.text(f'ANALYZE {SRC}."{name}"'))
    if vacuum:  # pages as a running MessageBox's are: read before (hint bits set), not just written
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for name in ("Spool", "MessageParts", "Parts", f"{HOST}Q"):
                conn.execute(sa.text(f'VACUUM {SRC}."{name}"'))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--pg", default=PG)
    p.add_argument("--only", nargs="+", choices=["pure-Python", "compiled"], help="run these readers only")
    p.add_argument("--vacuum", action="store_true", help="VACUUM the store after seeding it: its pages read once, as a "
                   "running MessageBox's are, where a store just written makes the first reader set every row's hint bits")
    p.add_argument("--batch-size", type=int, help="`sync --once --batch-size B`: rows a pass for the run (the job's "
                   "config says 1,000, a scheduled sync's default)")
    args = p.parse_args()
    sized = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    engine = sa.create_engine(args.pg)
    rates = {}
    for label in args.only or ["pure-Python", "compiled"]:
        os.environ["QBRIDGE_COMPILED_READERS"] = "0" if label == "pure-Python" else "1"
        print(f"seeding {args.messages:,} BizTalk messages ...", flush=True)
        seed(engine, args.messages, args.vacuum)
        with tempfile.TemporaryDirectory(prefix="qbridge-bt-") as tmp:
            work = Path(tmp)
            (work / "mapping.toml").write_text('[routes]\n"*" = "Orders"\n')
            cfg = work / "bt.toml"
            cfg.write_text(CONFIG.format(pg=args.pg, host=HOST, src=SRC, tgt=TGT))
            subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(cfg)], check=True, capture_output=True)
            seconds, _, _, cpu = bench.timed([sys.executable, "-m", "bridge", "sync", "--once", "-c", str(cfg), *sized], work)
        with engine.connect() as conn:
            got = conn.execute(sa.text(f'SELECT count(*) FROM {TGT}."Orders"')).scalar_one()
        rates[label] = args.messages / seconds
        print(f"{label} readers: sync --once: {args.messages:,} messages in {seconds:.1f} s ({rates[label]:,.0f}/s); "
              f"delivered {got:,}", flush=True)
        # where the time goes: CPU by process kind, per message
        print(f"  {bench.cpu_line(seconds, cpu)}; " + ", ".join(f"{k} {v / args.messages * 1e6:.0f} µs" for k, v in cpu.items()
                                                               if v >= 0.05) + " a message", flush=True)
        if got != args.messages:
            sys.exit(f"expected {args.messages} delivered")
    if len(rates) == 2:
        print(f"compiled / pure-Python: {rates['compiled'] / rates['pure-Python']:.2f}")

if __name__ == "__main__":
    main()
