"""A legacy side and an NServiceBus side on real databases, with a config that joins them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import sqlalchemy as sa

from bridge.commands.main import main as cli_main
from bridge.config import load_config
from bridge.demo.run import MAPPING as DEMO_MAPPING
from bridge.demo.samples import create_nginn_queue, nginn_row
from bridge.pipeline.loop import JobRunner

TZ = "Europe/Warsaw"

# The demo's mapping, plus a renamed custom header and a template, so both rules are exercised.
MAPPING = DEMO_MAPPING.replace(
    '"_NG-ReplyTo" = "NServiceBus.ReplyToAddress"\n',
    '"_NG-ReplyTo" = "NServiceBus.ReplyToAddress"\n"Tenant" = "Acme.Tenant"\n',
).replace('"NServiceBus.OriginatingEndpoint" = "Legacy.{queue}"', '"Acme.Origin" = "legacy {queue}#{key}"')


@dataclass
class Bridge:
    """One test setup: where the legacy tables are, where NServiceBus is, and the config."""

    tmp: Path
    source_url: str
    target_url: str
    source_schema: str | None = None
    target_schema: str | None = None
    flavor: str = "postgresql"
    queues: list[str] = field(default_factory=lambda: ["MQueue1"])
    mode: str = "copy"
    batch_size: int = 1000
    window: str = "15m"
    mapping: str = MAPPING
    system: str = "nginn"
    schedule: str | None = None  # e.g. 'every = "1s"'
    extra: str = ""  # more lines of the job's table, e.g. 'max_rate = "50/s"'

    def __post_init__(self) -> None:
        self.source = sa.create_engine(self.source_url, pool_pre_ping=True)
        self.target = sa.create_engine(self.target_url, pool_pre_ping=True)
        if self.system == "nginn":
            self.tables = {q: create_nginn_queue(self.source, q, self.source_schema) for q in self.queues}
        self.write_config()

    def write_config(self) -> None:
        (self.tmp / "mapping.toml").write_text(self.mapping)
        src_schema = f', schema = "{self.source_schema}"' if self.source_schema else ""
        tgt_schema = f', schema = "{self.target_schema}"' if self.target_schema else ""
        queues = ", ".join(f'"{q}"' for q in self.queues)
        self.config = self.tmp / "bridge.toml"
        self.config.write_text(f"""
[connections]
legacy = "{self.source_url}"
nsb    = "{self.target_url}"

[[jobs]]
name     = "job1"
source   = {{ system = "{self.system}", connection = "legacy", queues = [{queues}], timezone = "{TZ}", database = "LegacyDb"{src_schema} }}
target   = {{ connection = "nsb", flavor = "{self.flavor}"{tgt_schema} }}
mapping  = "mapping.toml"
mode     = "{self.mode}"
batch_size = {self.batch_size}
late_commit_window = "{self.window}"
""" + (f"schedule = {{ {self.schedule} }}\n" if self.schedule else "") + self.extra)

    # -- legacy side -----------------------------------------------------------------------
    def now_local(self) -> datetime:
        return datetime.now(ZoneInfo(TZ)).replace(tzinfo=None, microsecond=0)

    def insert(self, rows: list[dict[str, Any]], queue: str = "MQueue1") -> list[int]:
        with self.source.begin() as conn:
            return self.insert_in(conn, rows, queue)

    def insert_in(self, conn: sa.Connection, rows: list[dict[str, Any]], queue: str = "MQueue1") -> list[int]:
        t = self.tables[queue]
        ids = []
        for row in rows:
            ids.append(conn.execute(t.insert().values(row).returning(t.c.id)).scalar_one())
        return ids

    def ready(self, n: int, queue: str = "MQueue1", start: int = 1) -> list[dict[str, Any]]:
        now = self.now_local()
        return [nginn_row(queue, i, now, headers="Tenant=acme|_NG-Seq=1") for i in range(start, start + n)]

    def subqueues(self, queue: str = "MQueue1") -> dict[int, str]:
        t = self.tables[queue]
        with self.source.connect() as conn:
            return dict(conn.execute(sa.select(t.c.id, t.c.subqueue)).all())

    # -- NServiceBus side --------------------------------------------------------------------
    def _qualified(self, name: str) -> str:
        prep = self.target.dialect.identifier_preparer
        q = prep.quote_identifier(name)
        return f"{prep.quote_identifier(self.target_schema)}.{q}" if self.target_schema else q

    def rows(self, table: str) -> list[dict[str, Any]]:
        """Rows of a transport table with headers parsed; column names in SQL Server spelling."""
        with self.target.connect() as conn:
            result = conn.execute(sa.text(f"select * from {self._qualified(table)}")).mappings().all()
        out = []
        for r in result:
            row = {k.lower(): v for k, v in r.items()}
            row["headers"] = orjson.loads(row["headers"])
            out.append(row)
        return out

    def count(self, table: str) -> int:
        with self.target.connect() as conn:
            return conn.execute(sa.text(f"select count(*) from {self._qualified(table)}")).scalar_one()

    def delete_all(self, table: str) -> None:
        """What an NServiceBus endpoint does when it consumes its queue."""
        with self.target.begin() as conn:
            conn.execute(sa.text(f"delete from {self._qualified(table)}"))

    def message_ids(self, *tables: str) -> Counter[str]:
        c: Counter[str] = Counter()
        for t in tables:
            c.update(r["headers"]["NServiceBus.MessageId"] for r in self.rows(t))
        return c

    def ledger(self) -> Counter[str]:
        """Messages per outcome: per-message entries, and the range ledger's bits (NGinn keys)."""
        with self.target.connect() as conn:
            name = self._qualified("qbridge_ledger")
            out = Counter(dict(conn.execute(sa.text(f"select outcome, count(*) from {name} group by outcome")).all()))
            ranges = self._qualified("qbridge_ledger_ranges")
            if sa.inspect(conn).has_table("qbridge_ledger_ranges", schema=self.target_schema):
                for delivered, skipped in conn.execute(sa.text(f"select delivered, skipped from {ranges}")):
                    out["delivered"] += int.from_bytes(delivered, "little").bit_count()
                    out["skipped"] += int.from_bytes(skipped, "little").bit_count()
            return +out

    # -- running qbridge ---------------------------------------------------------------------
    def cli(self, *args: str) -> int:
        return cli_main([*args[:1], "-c", str(self.config), *args[1:]])

    def runner(self) -> JobRunner:
        config = load_config(self.config)
        return JobRunner(config, config.jobs[0])

    def spawn_args(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "bridge", args[0], "-c", str(self.config), *args[1:]]

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.spawn_args(*args), env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def dispose(self) -> None:
        self.source.dispose()
        self.target.dispose()


def sqlite_nginn(tmp_path: Path, rows: list[dict[str, Any]]) -> Bridge:
    """An NGinn queue and a target on SQLite files under `tmp_path`, initialised, holding `rows`."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    b.insert(rows)
    return b


def local(dt: datetime, hours: float = 0) -> datetime:
    return dt + timedelta(hours=hours)


def kill_at(b: Bridge, point: str, tmp: Path, command: tuple[str, ...] = ("sync", "--once")) -> None:
    """Runs `qbridge sync --once` (or `command`), waits until it is frozen at fault point `point`, SIGKILLs it."""
    import signal
    import time

    marker = tmp / f"paused-{point}"
    proc = b.spawn(*command, env={"QBRIDGE_FAULT_PAUSE": point, "QBRIDGE_FAULT_FILE": str(marker)})
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "qbridge never reached the fault point"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def walk_slices(source: Any, conn: sa.Connection, bounds: list, page_size: int) -> list:
    """Every key of a scan source the way Spark's tasks read it: slice by slice between the
    boundaries, each slice page by page (keyset paging)."""
    seen: list = []
    after = None
    for upto in [*bounds, None]:
        cursor = after
        while True:
            page, last = source.slice_page(conn, cursor, upto, page_size)
            seen += page
            if len(page) < page_size:
                break
            cursor = last
        after = upto
    return seen


def unfold_ranges(b: Bridge) -> int:
    """Makes a ledger look like one an earlier qbridge made: every NGinn key an entry of its own,
    no range ledger. Returns how many entries it wrote."""
    from bridge.ledger.state import LEDGER_COLUMNS
    from bridge.model import message_ids

    runner = b.runner()
    state, job = runner.state, runner.job.name
    now = datetime.utcnow()
    n = 0
    with runner.target_engine.begin() as conn:
        for queue, origin in runner.origins.items():
            have = {int(k) for k, _ in state.ledger_keys(conn, job, origin)}
            bits = [(k, o) for k, o in state.ranges.stream(conn, origin) if k not in have]
            ids = message_ids(runner.job.source.system, runner.database, queue, [str(k) for k, _ in bits])
            rows = [dict(zip(LEDGER_COLUMNS, (origin, str(k), mid, job, queue, o, None, None, now)))
                    for (k, o), mid in zip(bits, ids)]
            if rows:
                conn.execute(state.ledger.insert(), rows)
            n += len(rows)
    state.ranges.table.drop(runner.target_engine)
    return n


def flaky_passes(monkeypatch: Any, every: int = 3, *modules: Any) -> dict[str, int]:
    """Every `every`-th pass fails as a cut connection would, before it does anything; the
    retries of `modules` (which import with_backoff) do not sleep. Returns the count of passes."""
    from bridge.pipeline import passes
    from bridge.retry import with_backoff

    calls = {"n": 0}
    original = passes.Passes.run_pass

    def flaky(self: Any, queue: str) -> Any:
        calls["n"] += 1
        if calls["n"] % every == 0:
            raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
        return original(self, queue)

    monkeypatch.setattr(passes.Passes, "run_pass", flaky)
    for module in modules:
        monkeypatch.setattr(module, "with_backoff", lambda *a, **k: with_backoff(*a, **{**k, "sleep": lambda s: None}))
    return calls


def fails_on_call(monkeypatch: Any, owner: Any, name: str, n: int, statement: str = "INSERT") -> None:
    """The `n`-th call of `owner.name` (a class's method or an object's) raises as a cut connection
    does in `statement`; the others run as before."""
    original, calls = getattr(owner, name), {"n": 0}

    def failing(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise sa.exc.OperationalError(statement, {}, Exception("server closed the connection unexpectedly"))
        return original(*a, **k)

    monkeypatch.setattr(owner, name, failing)


def endpoint_takes(b: Bridge, n: int, table: str = "Orders") -> list[str]:
    """An endpoint receives (deletes) the first n rows of `table`; returns their message ids."""
    t = sa.table(table, sa.column("seq"), sa.column("headers"), schema=b.target_schema)
    with b.target.begin() as conn:
        rows = conn.execute(sa.select(t.c.seq, t.c.headers).order_by(t.c.seq).limit(n)).all()
        conn.execute(sa.delete(t).where(t.c.seq.in_([r[0] for r in rows])))
    return [orjson.loads(h)["NServiceBus.MessageId"] for _, h in rows]


def promtool_path() -> str:
    """Debian's promtool: a test that needs it fails in CI without it, and skips elsewhere saying what to install."""
    import shutil

    import pytest
    from conftest import IN_CI

    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (apt-get install prometheus, or run `bash .ci/run`)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return found


# The first lines of a script run by `python -c`: `first` holds each module a thread looked for
# first and that thread's name (what a test of import races reads at the script's end).
IMPORT_SPY = """
import sys, threading, atexit
first = {}
class Spy:
    @staticmethod
    def find_spec(name, path=None, target=None):
        first.setdefault(name, threading.current_thread().name)
        return None
sys.meta_path.insert(0, Spy)
"""


class Killed(BaseException):
    """A process's death at a chosen point: no `except Exception` on the way catches it."""


def init_killed_at_mark(b: Bridge, monkeypatch: Any, n: int = 3, why: str = "init killed in its third transaction") -> None:
    """`qbridge init` folding an earlier per-message ledger two keys a chunk, killed in its `n`th
    range-bit transaction (1: the quarantined bits, 2: the first chunk, 3: the second); then
    Ranges.mark is itself again."""
    import pytest

    from bridge.ledger import ranges_upgrade
    from bridge.ledger.ranges import Ranges

    monkeypatch.setattr(ranges_upgrade, "CHUNK", 2)
    calls = {"n": 0}
    real = Ranges.mark

    def cut(self: Any, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == n:
            raise Killed(why)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Ranges, "mark", cut)
    with pytest.raises(Killed):
        b.cli("init")
    monkeypatch.setattr(Ranges, "mark", real)


def run_two_jobs(b: Bridge, spy: str) -> str:
    """`qbridge run` of the bridge's config split into two scheduled jobs (job1 on MQueue1, job2 on
    MQueue2, 900 rows each, already inserted), under the Python script `spy` (given the config's
    path); its standard output once both queues are delivered and it was stopped by SIGTERM."""
    import signal
    import time

    text = b.config.read_text()
    head, job = text[:text.index("[[jobs]]")], text[text.index("[[jobs]]"):]
    both = 'queues = ["MQueue1", "MQueue2"]'
    b.config.write_text(head + job.replace(both, 'queues = ["MQueue1"]') + 'schedule = { every = "60s" }\n'
                        + job.replace('name     = "job1"', 'name     = "job2"').replace(both, 'queues = ["MQueue2"]')
                        + 'schedule = { every = "60s" }\n')
    proc = subprocess.Popen([sys.executable, "-c", spy, str(b.config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while (b.count("Orders") < 900 or b.count("Billing") < 900) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert len(b.message_ids("Orders")) == 900 and len(b.message_ids("Billing")) == 900
    return out


def entries_without_bits(b: Bridge, queue: str = "MQueue1") -> list[str]:
    """The keys of `queue`'s ledger entries that have no bit in its range ledger."""
    runner = b.runner()
    origin, l = runner.origins[queue], runner.state.ledger
    with runner.target_engine.connect() as conn:
        keys = conn.execute(sa.select(l.c.source_key).where(l.c.origin == origin)).scalars().all()
        have = runner.state.ranges.lookup(conn, origin, [int(k) for k in keys])
    return sorted(k for k in keys if int(k) not in have)


def each_once_after_a_re_read_and_replay(b: Bridge, n: int, mapping: str, queue: str = "MQueue1") -> None:
    """The operator routes the type (`mapping`), a copy pass reads `queue` again (a rollback's
    lowered checkpoint, a renamed job), and the quarantine is replayed: each of the `n` messages once."""
    from bridge.lifecycle.quarantine import QuarantineDesk

    b.mapping = mapping
    b.write_config()
    runner = b.runner()
    c = runner.state.checkpoint
    with runner.target_engine.begin() as conn:
        conn.execute(sa.update(c).where(c.c.queue == queue).values(high=None, gaps="[]"))
    passes: list[Any] = []
    b.runner().drain(queue, passes.append)
    QuarantineDesk(b.runner(), "ops", None).replay(None)
    ids = b.message_ids("Orders")
    assert len(ids) == n and all(k == 1 for k in ids.values()), f"delivered twice: {ids}"
    assert sum(p.delivered for p in passes) == 0


# Routed by the legacy type only: a message of another type has no route and is quarantined ...
BY_TYPE = (MAPPING.replace('"MQueue1" = "Orders"\n', '"Orders.PlaceOrder, Orders" = "Orders"\n')
           .replace('"*"       = "Unrouted"\n', ""))
# ... until the operator routes it (and then replays what the quarantine holds).
FIXED = BY_TYPE.replace('"Orders.PlaceOrder, Orders" = "Orders"\n',
                        '"Orders.PlaceOrder, Orders" = "Orders"\n"Other.Thing, X" = "Orders"\n')


def unrouted_rows(now: datetime, odd: set[int], n: int, queue: str = "MQueue1") -> list[dict[str, Any]]:
    """`n` NGinn rows; those numbered in `odd` of a type the BY_TYPE mapping does not route."""
    from bridge.demo.samples import nginn_body, nginn_row

    return [nginn_row(queue, i, now, body=nginn_body("Other.Thing, X", OrderId=i) if i in odd else None)
            for i in range(1, n + 1)]
