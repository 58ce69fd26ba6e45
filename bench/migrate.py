"""Bulk migration speed and memory: qbridge on Spark, the in-process engine, PostgreSQL's own
bulk path and dlt, on the same seeded NGinn rows in one run.

    python3 bench/migrate.py                        # N = 500k and 1M, every engine
    python3 bench/migrate.py --rows 5000000 --engines ad
    python3 bench/migrate.py --repeat 3             # medians of 3 rounds, each engine in turn
    python3 bench/migrate.py --rows 500000 --engines ab --batch-size 10000   # the job's rows a transaction (default 2000)
    python3 bench/migrate.py --rows 500000 --engines aem --mapping bench/story_mapping.toml
    pip install -e '.[bench]'                       # dlt, for (e)

Per N it seeds an NGinn queue table on the local PostgreSQL (70% ready, 10% delayed, 10%
failed, 10% processed; ~500-byte JSON bodies with `$type`; a few headers), then times
  (a) `qbridge migrate` (Spark local[*]),
  (b) `qbridge sync --once` (the in-process engine),
  (r) (b) with QBRIDGE_READ_AHEAD=0: its passes without the read-ahead (bridge/pipeline/read_ahead.py),
      so b/r is what reading the next batch while a pass commits gains,
  (c) `COPY (SELECT <the same column transformation>) TO STDOUT` piped into `COPY ... FROM STDIN`
      of NServiceBus-shaped tables, per destination table,
  (d) the plain pipe: the ready rows' columns (id, headers text, body as bytes, times) with
      `COPY ... TO STDOUT (FORMAT BINARY)` into `COPY ... FROM STDIN (FORMAT BINARY)` of a
      same-shaped table, no transformation (what the database spends moving these bytes),
  (e) dlt: `sql_table` (pyarrow backend) -> `postgres` destination (parquet loader files, which
      dlt loads through ADBC: adbc-driver-postgresql is in the bench extra, and without it dlt
      quietly loads insert_values at half the rate), the whole table, as dlt's docs recommend for speed,
  (f) the floor, not a goal's reference: (d)'s pipe into the table exactly-once must write per
      message, the transport's queue table (uuid primary key, seq), in one transaction (NGinn's
      ledger is one range row per 1,024 keys since issue 27: nothing per message); f/d is what
      that table costs the database itself,
  (g) (a)'s own rows, not a goal's reference: right after (a), the transport rows, ledger entries
      and range rows (a) wrote, piped as (d) pipes into same-shaped tables (their indexes included)
      in one transaction: what the database alone spends on exactly what qbridge writes, as if
      reading and transforming cost nothing; g/d is a bound no transform can beat,
  (m) with --mapping FILE: (a) with that mapping (bench/story_mapping.toml holds issue 47's rules),
      into a target of its own; m/a (time) is what the rules cost, m/e (rows/s) against dlt,
and, after (a), the ledger's size (per-message entries, range rows, bytes on disk, against the
184 bytes a message the per-message ledger took) and `qbridge verify` of what it moved (time,
peak RSS); (a) runs with the Spark driver's
class-data archive in place (made first when missing, as a machine's first `migrate` does);
each as its own process, sampling the summed RSS of its Python processes (driver and Spark's
Python workers; the JVM is not a Python process) every 100 ms, and the CPU seconds of its
processes by kind and of PostgreSQL's over the same time (on 2 cores beside the database, a CPU-
bound engine's wall time is about its CPU seconds over 2: the line says how busy the cores were).
Prints rows/s, a/d (time),
a/e (rows/s), a/c, a/g and g/d (time), peak RSS, and where (a)'s time went. Goals (issue 12): a/d <= 3.0 at 500k
and 1M, a >= c, a >= 5x e, peak RSS at 1M within 20% of 500k.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import psycopg
import sqlalchemy as sa

PG = "postgresql+psycopg://127.0.0.1/test"
SRC, TGT, REF, DLT = "qbench_src", "qbench_tgt", "qbench_ref", "qbench_dlt"
TGT_M = "qbench_tgtm"  # (m): (a) with --mapping's mapping
BATCH = [2000]  # the job's batch_size (--batch-size)
QUEUE = "MQueue1"
TZ = "Europe/Warsaw"

MAPPING = """\
[routes]
"MQueue1" = "Orders"
"*"       = "Orders"

[headers.rename]
"_NG-ReplyTo" = "NServiceBus.ReplyToAddress"

[states]
ready = "queue"
delayed = "delayed"
failed = "error"
processed = "skip"
"""

CONFIG = """\
[connections]
legacy = "{pg}"
nsb    = "{pg}"

[[jobs]]
name       = "bench"
source     = {{ system = "nginn", connection = "legacy", queues = ["{queue}"], timezone = "{tz}", database = "LegacyDb", schema = "{src}" }}
target     = {{ connection = "nsb", flavor = "postgresql", schema = "{tgt}" }}
mapping    = "mapping.toml"
batch_size = {batch}
"""

SEED = f"""
INSERT INTO "{SRC}"."{QUEUE}" (from_endpoint, to_endpoint, subqueue, insert_time, last_processed, retry_count,
                               retry_time, error_info, correlation_id, label, msg_text, msg_headers, unique_id)
SELECT 'sql://db/Sender', 'sql://db/{QUEUE}',
       s.q,
       now()::timestamp - interval '1 hour' + g * interval '1 millisecond',
       CASE WHEN s.q IN ('X', 'F', 'R') THEN now()::timestamp END,
       CASE s.q WHEN 'F' THEN 3 WHEN 'R' THEN 1 ELSE 0 END,
       CASE WHEN s.q = 'R' THEN now()::timestamp + interval '1 day' ELSE now()::timestamp END,
       CASE WHEN s.q = 'F' THEN 'System.InvalidOperationException: Order ' || g || ' cannot be shipped' || chr(13) || chr(10) ||
                                '   at Shop.Handlers.ShipOrderHandler.Handle(ShipOrder message)' END,
       'corr-' || (g / 10), NULL,
       '{{"$type":"Shop.Messages.OrderPlaced, Shop.Messages","OrderId":' || g ||
         ',"Customer":"customer-' || (g %% 997) || '","Lines":[' ||
         repeat('{{"Sku":"SKU-000123","Qty":2,"Price":19.99}},', 9) || '{{"Sku":"SKU-000999","Qty":1,"Price":5.00}}],' ||
         '"Note":"' || repeat('x', 40) || '"}}',
       '_NG-ReplyTo=sql://db/Replies|Tenant=acme|Region=eu-' || (g %% 3) || '|Seq=' || g,
       md5(g::text)
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (SELECT CASE WHEN g %% 10 < 7 THEN 'I' WHEN g %% 10 = 7 THEN 'R' WHEN g %% 10 = 8 THEN 'F' ELSE 'X' END AS q) s
"""

# (c): the headers qbridge writes for these rows, built by PostgreSQL itself.
_HEADERS = f"""json_build_object(
    'NServiceBus.MessageId', md5('nginn/LegacyDb/{QUEUE}/' || id)::uuid,
    'NServiceBus.MessageIntent', 'Send',
    'NServiceBus.TimeSent', to_char((insert_time AT TIME ZONE '{TZ}') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS:US') || ' Z',
    'NServiceBus.CorrelationId', correlation_id,
    'NServiceBus.ConversationId', md5('nginn/LegacyDb/{QUEUE}/' || id)::uuid,
    'NServiceBus.EnclosedMessageTypes', msg_text::json->>'$type',
    'NServiceBus.ContentType', 'application/json',
    'NServiceBus.ReplyToAddress', split_part(substring(msg_headers from '_NG-ReplyTo=([^|]*)'), '/', 4),
    'NServiceBus.OriginatingEndpoint', '{QUEUE}',
    'QBridge.Source', 'nginn://LegacyDb/{QUEUE}/' || id,
    'NGinn.BusMessageId', id::text,
    'NGinn.FromEndpoint', from_endpoint,
    'NGinn.ToEndpoint', to_endpoint,
    'Tenant', substring(msg_headers from 'Tenant=([^|]*)'),
    'Region', substring(msg_headers from 'Region=([^|]*)'),
    'Seq', substring(msg_headers from 'Seq=([^|]*)')
)"""
_FAILURE = """jsonb_build_object(
    'NServiceBus.FailedQ', 'Orders',
    'NServiceBus.ExceptionInfo.ExceptionType', split_part(error_info, ':', 1),
    'NServiceBus.ExceptionInfo.Message', split_part(split_part(error_info, chr(13), 1), ': ', 2),
    'NServiceBus.ExceptionInfo.StackTrace', error_info,
    'NServiceBus.TimeOfFailure', to_char(last_processed, 'YYYY-MM-DD HH24:MI:SS:US') || ' Z')"""
REF_TABLES = [
    f'CREATE TABLE "{REF}"."{t}" (id uuid PRIMARY KEY, expires timestamp, headers text NOT NULL, body bytea, '
    'seq serial NOT NULL UNIQUE)' for t in ("Orders", "error")  # as the PostgreSQL transport creates them
] + [f'CREATE TABLE "{REF}"."Orders.Delayed" (id uuid PRIMARY KEY, headers text NOT NULL, body bytea, due timestamptz NOT NULL)',
     f'CREATE INDEX ON "{REF}"."Orders.Delayed" (due)',
     f'CREATE TABLE "{REF}"."plain" (id bigint, headers text, body bytea, insert_time timestamp, retry_time timestamp)']
REFERENCE = [
    (f'SELECT gen_random_uuid(), NULL::timestamp, {_HEADERS}::text, convert_to(msg_text, \'UTF8\') '
     f'FROM "{SRC}"."{QUEUE}" WHERE subqueue = \'I\'', f'"{REF}"."Orders" (id, expires, headers, body)'),
    (f'SELECT gen_random_uuid(), ({_HEADERS}::jsonb || {_FAILURE})::text, convert_to(msg_text, \'UTF8\') '
     f'FROM "{SRC}"."{QUEUE}" WHERE subqueue = \'F\'', f'"{REF}"."error" (id, headers, body)'),
    (f'SELECT gen_random_uuid(), {_HEADERS}::text, convert_to(msg_text, \'UTF8\'), retry_time '
     f'FROM "{SRC}"."{QUEUE}" WHERE subqueue = \'R\'', f'"{REF}"."Orders.Delayed" (id, headers, body, due)'),
]


PLAIN = (f'SELECT id, msg_headers, convert_to(msg_text, \'UTF8\'), insert_time, retry_time FROM "{SRC}"."{QUEUE}" '
         "WHERE subqueue = 'I'", f'"{REF}"."plain" (id, headers, body, insert_time, retry_time)')


# (f): the same pipe as (d), into what exactly-once has to write per message: the transport's
# queue table (uuid primary key with growing ids, seq). The range ledger adds a row per 1,024 keys.
def floor_statements() -> list[tuple[str, str]]:
    # Growing row ids, as qbridge's writer gives them (model.row_ids, UUIDv7): a hashed id here
    # would put every insert on a random page of the primary key and overstate the floor.
    return [
        (f'SELECT lpad(to_hex(id), 32, \'0\')::uuid, msg_headers, convert_to(msg_text, \'UTF8\') '
         f'FROM "{SRC}"."{QUEUE}" WHERE subqueue = \'I\'', f'"{REF}"."Orders" (id, headers, body)'),
    ]


# (g): what (a) wrote, table by table (the transport numbers `seq` itself, as in (a)).
OWN_TABLES = ("Orders", "Orders.Delayed", "error", "qbridge_ledger", "qbridge_ledger_ranges")


def own_rows_tables() -> list[str]:
    """REF's tables for (g), the same as (a)'s in TGT: columns, defaults, keys and indexes."""
    return [f'CREATE TABLE "{REF}"."{t}" (LIKE "{TGT}"."{t}" INCLUDING ALL)' for t in OWN_TABLES]


PER_MESSAGE_LEDGER = 184  # bytes a message, measured on the per-message ledger (issue 27)


def ledger_size(url: str) -> tuple[int, int, int]:
    """(per-message entries, range rows, bytes of both tables with their indexes) in TGT."""
    names = ("qbridge_ledger", "qbridge_ledger_ranges")
    size = sum(scalar(url, f"SELECT pg_total_relation_size('\"{TGT}\".\"{t}\"')") for t in names)
    return count(url, f'"{TGT}"."{names[0]}"'), count(url, f'"{TGT}"."{names[1]}"'), size


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def pipe(src: psycopg.Connection, dst: psycopg.Connection, select: str, table: str, binary: bool = True) -> None:
    """`COPY (select) TO STDOUT` on `src` streamed into `COPY table FROM STDIN` on `dst`, block by block."""
    fmt = " (FORMAT BINARY)" if binary else ""
    with src.cursor().copy(f"COPY ({select}) TO STDOUT{fmt}") as out, dst.cursor().copy(f"COPY {table} FROM STDIN{fmt}") as into:
        for block in out:
            into.write(block)


def reference(url: str) -> None:
    """(c), run in its own process: one COPY-to-COPY pipe per destination table."""
    with psycopg.connect(libpq(url)) as src, psycopg.connect(libpq(url)) as dst:
        for select, table in REFERENCE:
            pipe(src, dst, select, table, binary=False)
        dst.commit()


def plain_pipe(url: str) -> None:
    """(d), in its own process: one binary COPY-to-COPY pipe, no transformation."""
    select, table = PLAIN
    with psycopg.connect(libpq(url)) as src, psycopg.connect(libpq(url)) as dst:
        pipe(src, dst, select, table)
        dst.commit()


def floor_pipe(url: str) -> None:
    """(f), in its own process: a binary COPY-to-COPY pipe into the queue table, in one
    transaction, no transformation: what the database spends on the rows exactly-once writes."""
    with psycopg.connect(libpq(url)) as src, psycopg.connect(libpq(url)) as dst:
        for select, table in floor_statements():
            pipe(src, dst, select, table)
        dst.commit()


def own_rows_pipe(url: str) -> None:
    """(g), in its own process: (d)'s binary pipe, carrying the rows (a) wrote into same-shaped
    tables, in one transaction."""
    with psycopg.connect(libpq(url)) as src, psycopg.connect(libpq(url)) as dst:
        for table in OWN_TABLES:
            columns = [name for (name,) in src.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "AND column_name <> 'seq' ORDER BY ordinal_position", (TGT, table))]
            names = ", ".join(f'"{c}"' for c in columns)
            pipe(src, dst, f'SELECT {names} FROM "{TGT}"."{table}"', f'"{REF}"."{table}" ({names})')
        dst.commit()


def dlt_copy(url: str) -> None:
    """(e), in its own process: dlt's sql_table -> postgres, its fast path (pyarrow, parquet)."""
    import dlt
    from dlt.sources.sql_database import sql_table

    work = tempfile.mkdtemp(prefix="qbench-dlt-")
    os.environ["DLT_DATA_DIR"] = work
    # dlt wants a user and password in postgres credentials; trust auth ignores the password.
    creds = libpq(url).replace("postgresql://", f"postgresql://{os.environ.get('USER', 'root')}:unused@", 1) \
        if "@" not in url else libpq(url)
    source = sql_table(credentials=creds, table=QUEUE, schema=SRC, backend="pyarrow", chunk_size=50_000)
    pipeline = dlt.pipeline(pipeline_name="qbench", destination=dlt.destinations.postgres(credentials=creds),
                            dataset_name=DLT, pipelines_dir=work)
    pipeline.run(source, loader_file_format="parquet", write_disposition="replace")


class RssSampler(threading.Thread):
    """Peak summed RSS of the Python processes in a process tree, sampled every 100 ms, and the
    CPU seconds each process of the tree used, by kind (Python, the JVM), as last sampled."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root, self.peak, self.stop = root, 0, threading.Event()
        self.cpu: dict[int, tuple[str, int]] = {}  # pid -> (name, utime + stime ticks)

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, sum(rss for _, rss in self._python_tree()))
            self.stop.wait(0.1)

    def cpu_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, ticks in self.cpu.values():
            kind = "Python" if name.startswith("python") else "JVM" if name == "java" else "other"
            out[kind] = out.get(kind, 0.0) + ticks / TICKS
        return out

    def _python_tree(self) -> list[tuple[int, int]]:
        parents: dict[int, int] = {}
        names: dict[int, str] = {}
        ticks: dict[int, int] = {}
        for pid, name, fields in processes():
            parents[pid] = int(fields[1])
            ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime
            names[pid] = name
        tree, frontier = {self.root}, [self.root]
        while frontier:
            p = frontier.pop()
            for child, parent in parents.items():
                if parent == p and child not in tree:
                    tree.add(child)
                    frontier.append(child)
        out = []
        for p in tree:
            if p in ticks:
                self.cpu[p] = (names[p], ticks[p])
            if names.get(p, "").startswith("python"):
                try:  # resident pages from statm: one small read per Python process
                    out.append((p, int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")))
                except OSError:
                    pass
        return out


TICKS = os.sysconf("SC_CLK_TCK")


def processes() -> Iterator[tuple[int, str, list[str]]]:
    """(pid, name, the fields of /proc/PID/stat after the name) of every process now."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        yield int(entry), stat[stat.index("(") + 1: stat.rindex(")")], stat.rsplit(")", 1)[1].split()


def database_cpu() -> float:
    """CPU seconds PostgreSQL's processes have used so far: the live ones', and through the
    postmaster's children counters, those of the backends that have exited."""
    total = 0
    for _, name, fields in processes():
        if name != "postgres":
            continue
        total += int(fields[11]) + int(fields[12])
        if Path(f"/proc/{fields[1]}/comm").read_text().strip() != "postgres":  # the postmaster: reaped backends
            total += int(fields[13]) + int(fields[14])
    return total / TICKS


def class_archive_ready() -> None:
    """(a) is timed as every `migrate` after a machine's first runs: with the driver JVM's
    class-data archive in place (the first start makes it, once; README, Bulk migration)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from bridge.pipeline.spark import spark_context, stop_spark; "
                    "stop_spark(spark_context('local[1]'))"], check=True, capture_output=True)
    print(f"Spark driver class-data archive in place ({time.perf_counter() - started:.1f} s to check or make)", flush=True)


def timed(cmd: list[str], cwd: Path) -> tuple[float, int, str, dict[str, float]]:
    """(seconds, peak RSS of its Python processes, stderr, CPU seconds by kind: its Python
    processes, its JVM, and PostgreSQL's processes over the same time)."""
    db_before = database_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = RssSampler(proc.pid)
    sampler.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err.decode()[-3000:]}")
    cpu = sampler.cpu_by_kind()
    cpu["PostgreSQL"] = database_cpu() - db_before
    return seconds, sampler.peak, err.decode(errors="replace"), cpu


def cpu_line(seconds: float, cpu: dict[str, float]) -> str:
    """Where the CPU went, against what the machine's cores could give over the wall time."""
    parts = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items() if v >= 0.05)
    from bridge.pipeline.cpus import usable_cpus

    total, cores = sum(cpu.values()), usable_cpus()
    return f"CPU s: {parts} = {total:.1f} ({total / (seconds * cores):.0%} of {cores} cores' time)"


def sql(url: str, *statements: str, **params: object) -> None:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        for s in statements:
            conn.execute(s, params or None)


def count(url: str, table: str) -> int:
    return scalar(url, f"SELECT count(*) FROM {table}")


def scalar(url: str, query: str) -> int:
    with psycopg.connect(libpq(url)) as conn:
        return conn.execute(query).fetchone()[0]


def fresh_target(url: str, work: Path, schema: str) -> None:
    sql(url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE', f'CREATE SCHEMA "{schema}"')
    cfg = work / f"{schema}.toml"
    text = CONFIG.format(pg=url, queue=QUEUE, tz=TZ, src=SRC, tgt=schema, batch=BATCH[0])
    cfg.write_text(text.replace('"mapping.toml"', '"mapping-m.toml"') if schema == TGT_M else text)
    subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(cfg)], cwd=work, check=True, stdout=subprocess.DEVNULL)


ENGINES = "abrcdefgtm"


def seed_queue(url: str, n: int, seed: str = SEED) -> None:
    """A fresh NGinn queue table in SRC with `n` rows of `seed` (the other bench scripts use it too)."""
    from bridge.sources.nginn import queue_table

    print(f"seeding {n:,} NGinn rows ...", flush=True)
    sql(url, f'DROP SCHEMA IF EXISTS "{SRC}" CASCADE', f'CREATE SCHEMA "{SRC}"')
    engine = sa.create_engine(url)
    queue_table(QUEUE, SRC).create(engine)
    engine.dispose()
    sql(url, seed, n=n)
    sql(url, f'ANALYZE "{SRC}"."{QUEUE}"')


def run_size(url: str, n: int, work: Path, engines: str, repeat: int = 1) -> dict[str, tuple[float, int, int]]:
    """Each engine's (median seconds, highest peak RSS, rows) over `repeat` rounds; a round runs
    every engine once, so that a machine's drift falls on all of them alike."""
    seed_queue(url, n)
    runs: dict[str, list[tuple[float, int, int]]] = {}
    for round_ in range(1, repeat + 1):
        if repeat > 1:
            print(f"  round {round_} of {repeat}", flush=True)
        for name, got in _round(url, n, work, engines).items():
            runs.setdefault(name, []).append(got)
    results = {name: (statistics.median(r[0] for r in rs), max(r[1] for r in rs), rs[0][2]) for name, rs in runs.items()}
    if repeat > 1:
        print("  spread over the rounds (fastest .. slowest, s): " + ", ".join(
            f"({k}) {min(r[0] for r in rs):.1f}..{max(r[0] for r in rs):.1f}" for k, rs in runs.items()), flush=True)
    return results


SINK: dict[str, Any] = {"url": None, "spans": 0}


def otlp_sink() -> str:
    """An OTLP/HTTP receiver that counts the spans it is sent and keeps nothing (for (t))."""
    if SINK["url"] is None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Sink(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                SINK["spans"] += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        SINK["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    return SINK["url"]


def _round(url: str, n: int, work: Path, engines: str) -> dict[str, tuple[float, int, int]]:
    moved = n - n // 10  # processed rows are skipped by the mapping
    ready = sum(1 for g in range(1, n + 1) if g % 10 < 7)
    results: dict[str, tuple[float, int, int]] = {}
    py, me = sys.executable, str(Path(__file__).resolve())
    for name, schema, cmd in (
        ("d", REF, [py, me, "--plain", url]),
        ("f", REF, [py, me, "--floor", url]),
        ("c", REF, [py, me, "--reference", url]),
        ("e", DLT, [py, me, "--dlt", url]),
        ("a", TGT, [py, "-m", "bridge", "--log-level", "INFO", "migrate", "-c", str(work / f"{TGT}.toml")]),
        ("g", REF, [py, me, "--own-rows", url]),  # reads what (a) wrote: after (a), before (b) replaces it
        # (t): (a) with tracing on, spans sent over OTLP/HTTP to a sink in this process (issue 39)
        ("t", TGT, ["env", f"OTEL_EXPORTER_OTLP_ENDPOINT={otlp_sink()}", "OTEL_BSP_MAX_QUEUE_SIZE=65536",
                    py, "-m", "bridge", "--log-level", "INFO", "migrate", "-c", str(work / f"{TGT}.toml")]),
        ("b", TGT, [py, "-m", "bridge", "sync", "--once", "-c", str(work / f"{TGT}.toml")]),
        # (r): (b) without its read-ahead (bridge/pipeline/read_ahead.py), the pass as it was before
        ("r", TGT, ["env", "QBRIDGE_READ_AHEAD=0", py, "-m", "bridge", "sync", "--once", "-c", str(work / f"{TGT}.toml")]),
        # (m): (a) with the mapping --mapping names (issue 47's rules), into a target of its own
        ("m", TGT_M, [py, "-m", "bridge", "--log-level", "INFO", "migrate", "-c", str(work / f"{TGT_M}.toml")]),
    ):
        if name not in engines:
            continue
        if name == "g" and "a" not in results:
            sys.exit("(g) pipes the rows (a) wrote: run it with (a) (--engines ag)")
        if schema == REF:
            tables = own_rows_tables() if name == "g" else REF_TABLES
            sql(url, f'DROP SCHEMA IF EXISTS "{REF}" CASCADE', f'CREATE SCHEMA "{REF}"', *tables)
        elif schema == DLT:
            sql(url, f'DROP SCHEMA IF EXISTS "{DLT}" CASCADE')
        else:
            fresh_target(url, work, schema)
        sql(url, "CHECKPOINT")
        seconds, peak, err, cpu = timed(cmd, work)
        if name == "d":
            got, expected = count(url, f'"{REF}"."plain"'), ready
        elif name == "f":
            got, expected = count(url, f'"{REF}"."Orders"'), ready
        elif name == "e":
            got, expected = count(url, f'"{DLT}"."m_queue1"'), n
        elif name == "m":  # its rules route some rows elsewhere: every transport table counts
            got = sum(count(url, f'"{schema}"."{t}"') for t in ("Orders", "Orders.Delayed", "error", "Orders.EU", "Orders.EU.Delayed"))
            expected = moved
        else:
            got = sum(count(url, f'"{schema}"."{t}"') for t in ("Orders", "Orders.Delayed", "error"))
            expected = moved
        if got != expected:
            sys.exit(f"({name}) moved {got} rows, expected {expected}")
        results[name] = (seconds, peak, got)
        print(f"  ({name}) {seconds:7.1f} s  {got / seconds:9,.0f} rows/s  peak RSS {peak / 2**20:6.0f} MiB  "
              f"{cpu_line(seconds, cpu)}", flush=True)
        if name == "t":
            print(f"      tracing on: {SINK['spans']:,} spans received; t/a time {seconds / results['a'][0]:.3f}"
                  if "a" in results else f"      tracing on: {SINK['spans']:,} spans received", flush=True)
        if name == "a":
            for line in err.splitlines():
                if "where the time went" in line:
                    print("      " + line.split("INFO qbridge.migrate ", 1)[-1], flush=True)
            entries, blocks, size = ledger_size(url)
            print(f"      ledger after (a): {entries:,} entries + {blocks:,} range rows, {size / 2**20:.2f} MiB on disk "
                  f"({size / (n * PER_MESSAGE_LEDGER):.2%} of the {n * PER_MESSAGE_LEDGER / 2**20:,.0f} MiB "
                  f"a per-message ledger took at {PER_MESSAGE_LEDGER} B a message)", flush=True)
            # `verify` of what (a) moved: the source ids merged with the ledger as two streams.
            v_seconds, v_peak, _, _ = timed([py, "-m", "bridge", "verify", "-c", str(work / f"{TGT}.toml")], work)
            results["verify"] = (v_seconds, v_peak, n)
            print(f"      verify {v_seconds:.1f} s, peak RSS {v_peak / 2**20:.0f} MiB, balanced", flush=True)
    return results


def summary(table: dict[int, dict[str, tuple[float, int, int]]]) -> None:
    print()
    names = {"a": "(a) spark", "b": "(b) in-proc", "r": "(r) no r-a", "c": "(c) SQL", "d": "(d) pipe", "e": "(e) dlt", "f": "(f) floor",
             "g": "(g) own rows", "t": "(t) traced", "m": "(m) rules"}
    present = [k for k in ENGINES if all(k in r for r in table.values())]
    head = f"{'N':>10} " + " ".join(f"{names[k]:>12}" for k in present)
    ratios = [("a/d time", "a", "d"), ("a/f time", "a", "f"), ("f/d time", "f", "d"), ("a/g time", "a", "g"),
              ("g/d time", "g", "d"), ("a/c rate", "a", "c"),
              ("a/e rate", "a", "e"), ("b/e rate", "b", "e"), ("b/r rate", "b", "r"), ("t/a time", "t", "a"), ("m/e rate", "m", "e"), ("m/a time", "m", "a")]
    ratios = [r for r in ratios if r[1] in present and r[2] in present]
    head += "".join(f" {r[0]:>9}" for r in ratios) + "".join(f" {'RSS ' + k:>8}" for k in present)
    print(head + "   (rows/s; RSS in MiB)")
    for n, r in table.items():
        rate = {k: r[k][2] / r[k][0] for k in present}
        line = f"{n:>10,} " + " ".join(f"{rate[k]:>12,.0f}" for k in present)
        for label, x, y in ratios:
            value = r[x][0] / r[y][0] if label.endswith("time") else rate[x] / rate[y]
            line += f" {value:>9.2f}"
        line += "".join(f" {r[k][1] / 2**20:>8.0f}" for k in present)
        print(line)
    if len(table) > 1:
        small, large = min(table), max(table)
        for k in present:
            print(f"peak RSS ({k}) at {large:,} / at {small:,}: {table[large][k][1] / max(1, table[small][k][1]):.2f}"
                  f";  rows/s at {large:,} / at {small:,}: "
                  f"{(table[large][k][2] / table[large][k][0]) / (table[small][k][2] / table[small][k][0]):.2f}")
    verified = [(n, r["verify"]) for n, r in table.items() if "verify" in r]
    if len(verified) > 1:
        (small, vs), (large, vl) = verified[0], verified[-1]
        print(f"verify at {large:,} / at {small:,}: peak RSS {vl[1] / max(1, vs[1]):.2f}, time {vl[0] / vs[0]:.2f}")
    if "e" in present:
        import importlib.util

        import dlt

        # dlt loads parquet into PostgreSQL through ADBC only: without adbc-driver-postgresql it
        # drops parquet for its insert_values default and ran at half the rate (docs/benchmarks.md).
        adbc = importlib.util.find_spec("adbc_driver_postgresql") is not None
        print(f"(e) is dlt {dlt.__version__}, " + ("parquet loaded through ADBC (its fast path)" if adbc else
              "WITHOUT adbc-driver-postgresql: dlt falls back to insert_values, not its fast path "
              "(pip install -e '.[bench]')"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[500_000, 1_000_000])
    p.add_argument("--pg", default=os.environ.get("QBRIDGE_BENCH_PG", PG))
    p.add_argument("--engines", default="adfgce", help="which of a, b, c, d, e, f, g, r, t to run (default a, c, d, e, f, g; "
                   "t: (a) with tracing on, to an OTLP/HTTP sink)")
    p.add_argument("--mapping", metavar="FILE", help="(m): (a) with this mapping instead of the plain one (e.g. "
                   "bench/story_mapping.toml, issue 47's rules), beside (a) and (e) in the same run")
    p.add_argument("--repeat", type=int, default=1, metavar="R",
                   help="run every engine R times per N, alternating, and report medians (for a noisy machine)")
    p.add_argument("--batch-size", type=int, default=BATCH[0], metavar="B",
                   help="the qbridge job's batch_size, rows a transaction (default %(default)s)")
    p.add_argument("--floor", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--reference", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--plain", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--own-rows", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--dlt", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    for flag, run in ((args.reference, reference), (args.plain, plain_pipe), (args.dlt, dlt_copy), (args.floor, floor_pipe),
                      (args.own_rows, own_rows_pipe)):
        if flag:
            run(flag)
            return
    BATCH[0] = args.batch_size
    if "a" in args.engines:
        class_archive_ready()
    with tempfile.TemporaryDirectory(prefix="qbridge-bench-") as tmp:
        work = Path(tmp)
        (work / "mapping.toml").write_text(MAPPING)
        engines = args.engines
        if args.mapping:
            (work / "mapping-m.toml").write_text(Path(args.mapping).read_text())
            engines += "" if "m" in engines else "m"
        elif "m" in engines:
            sys.exit("(m) runs (a) with the mapping --mapping FILE names: give it")
        table = {n: run_size(args.pg, n, work, engines, max(1, args.repeat)) for n in args.rows}
    summary(table)
    sql(args.pg, *(f'DROP SCHEMA IF EXISTS "{s}" CASCADE' for s in (SRC, TGT, REF, DLT, TGT_M)))


if __name__ == "__main__":
    main()
