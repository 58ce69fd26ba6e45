"""`qbridge migrate` on a real Spark (local, and a standalone master and worker on loopback),
PostgreSQL to PostgreSQL: exactly once whatever Spark does with tasks and drivers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.pipeline.cpus import usable_cpus
from bridge.demo.samples import DOTNET_ERROR, nginn_body, nginn_row
from bridge.sources.nginn import NGinnSource
from helpers import Bridge

pytestmark = pytest.mark.slow


def _java() -> None:
    if shutil.which("java") is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("Java is not installed; Spark needs it")
        pytest.skip("Java is not installed; Spark needs it")


@pytest.fixture(autouse=True)
def _needs_java() -> None:
    _java()


def seed(b: Bridge, n: int, queue: str = "MQueue1") -> int:
    """`n` rows of every kind NGinn holds, two malformed ones among them; some ids deleted
    afterwards so the key space has holes. Returns the rows left."""
    now = b.now_local()
    rows = []
    for i in range(n):
        kind = i % 10
        if kind == 7:
            rows.append(nginn_row(queue, i, now, subqueue="F", error_info=DOTNET_ERROR))
        elif kind == 8:
            rows.append(nginn_row(queue, i, now, subqueue="R", retry_time=now.replace(year=now.year + 1)))
        elif kind == 9:
            rows.append(nginn_row(queue, i, now, subqueue="X"))
        else:
            rows.append(nginn_row(queue, i, now, headers="Tenant=acme|_NG-Seq=1",
                                  body=nginn_body("Shop.Messages.OrderPlaced, Shop", Id=i, Lines=["x" * 40] * 5)))
    rows[5]["msg_headers"] = "Filter=a=b"
    rows[6]["msg_text"] = "{not json"
    t = b.tables[queue]
    with b.source.begin() as conn:
        conn.execute(t.insert(), rows)
        deleted = conn.execute(t.delete().where(t.c.id % 97 == 0)).rowcount
    return n - deleted


def migrate(b: Bridge, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = b.spawn("migrate", *args, env=env)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def delivered_once(b: Bridge) -> int:
    """Every message in the target exactly once, and the books balance; returns how many."""
    ids = b.message_ids("Orders", "Orders.Delayed", "error")
    assert ids, "nothing was delivered"
    twice = [m for m, n in ids.items() if n > 1]
    assert not twice, f"{len(twice)} messages arrived more than once"
    assert b.cli("verify") == 0
    return len(ids)


def checkpoint(b: Bridge) -> tuple[int | None, str | None]:
    with b.target.connect() as conn:
        return tuple(conn.execute(sa.text(f'select high, gaps from "{b.target_schema}".qbridge_checkpoint')).one())


def test_migrate_on_spark_plans_units_and_moves_the_checkpoint(make) -> None:
    b = make(batch_size=150)
    left = seed(b, 3000)
    # A lower id whose transaction is still open while migrate runs: a hole for a unit.
    slow = b.source.connect()
    tx = slow.begin()
    [late] = b.insert_in(slow, b.ready(1))
    b.insert(b.ready(2, start=2))
    r = migrate(b, "--unit-rows", "400")
    assert r.returncode == 0, r.stderr
    assert "Spark UI" in r.stderr
    assert f"on {usable_cpus() + 1} task slots" in r.stderr  # local[*]: a slot more than the usable CPUs
    assert "job1/MQueue1" in r.stdout
    assert b.ledger()["quarantined"] == 2
    high, gaps = checkpoint(b)
    with b.source.connect() as conn:
        assert high == conn.execute(sa.text(f'select max(id) from "{b.source_schema}"."MQueue1"')).scalar_one()
    assert f"[{late}," in gaps, "the uncommitted id must stay watched as a gap"
    with b.target.connect() as conn:  # sampled for the planner as the units filled it (autovacuum may be off)
        sampled = conn.execute(sa.text("select count(*) from pg_stats where schemaname = :s and tablename = 'qbridge_ledger'"),
                               {"s": b.target_schema}).scalar_one()
    assert sampled > 0
    tx.commit()
    slow.close()
    assert b.cli("sync", "--once") == 0
    total = left + 3
    assert delivered_once(b) + b.ledger()["skipped"] + b.ledger()["quarantined"] == total
    # A second migrate finds nothing new and moves nothing twice.
    before = b.ledger()
    assert migrate(b).returncode == 0
    assert b.ledger() == before
    delivered_once(b)


def test_local_masters_get_their_slots_and_star_one_more_than_the_usable_cpus() -> None:
    from bridge.pipeline.spark import local_slots

    assert local_slots("local[*]") == usable_cpus() + 1  # tasks wait on the databases part of the time
    assert local_slots("local[3]") == 3 and local_slots("local[1]") == 1
    assert local_slots("local") == 1
    assert local_slots("spark://host:7077") is None and local_slots(None) is None


def test_a_task_failing_after_its_target_commit_is_retried_without_doubles(make, tmp_path: Path) -> None:
    b = make(batch_size=100)
    left = seed(b, 1200)
    marker = tmp_path / "faults"
    r = migrate(b, "--unit-rows", "300", env={"QBRIDGE_FAULT_FAIL": "after_target_commit", "QBRIDGE_FAULT_FILE": str(marker)})
    assert r.returncode == 0, r.stderr
    fired = marker.read_text().splitlines()
    assert len(fired) >= 4, fired  # every unit's first attempt failed once a batch had committed
    ledger = b.ledger()
    assert sum(ledger.values()) == left
    assert delivered_once(b) == ledger["delivered"]


def test_a_units_batches_take_the_columnar_lane_on_the_executors(make, tmp_path: Path) -> None:
    # Batches of NGinn's lane threshold and more: the lane runs in Spark's Python workers, where a
    # driver-side override cannot reach. Its first batch of each unit fails there once (the fault
    # is raised after the lane settled it, before its write): each unit is retried, nothing doubled.
    b = make(batch_size=NGinnSource.lane_min_rows + 16)
    left = seed(b, 2400)
    marker = tmp_path / "faults"
    r = migrate(b, "--unit-rows", "1000", env={"QBRIDGE_FAULT_FAIL": "lane_settled", "QBRIDGE_FAULT_FILE": str(marker)})
    assert r.returncode == 0, r.stderr
    fired = marker.read_text().splitlines()
    assert len(fired) >= 2 and all(line.endswith(" lane_settled failed") for line in fired), fired
    assert str(os.getpid()) not in {line.split()[0] for line in fired}
    ledger = b.ledger()
    assert sum(ledger.values()) == left
    assert delivered_once(b) == ledger["delivered"]


def test_a_task_that_always_fails_stops_the_migration_with_a_clear_error(make) -> None:
    b = make()
    seed(b, 50)
    # QBRIDGE_FAULT_FAIL only fires on first attempts; a broken target table fails every attempt.
    with b.target.begin() as conn:
        conn.execute(sa.text(f'alter table "{b.target_schema}"."Orders" add column must_fill int not null'))
    r = migrate(b)
    assert r.returncode == 1
    assert "a Spark task failed" in r.stderr and "must_fill" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_killed_driver_then_rerun_delivers_every_message_once(make, tmp_path: Path) -> None:
    b = make(batch_size=100)
    left = seed(b, 2000)
    marker = tmp_path / "paused"
    proc = b.spawn("migrate", "--unit-rows", "250",
                   env={"QBRIDGE_FAULT_PAUSE": "after_target_commit:3", "QBRIDGE_FAULT_FILE": str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no task reached the fault point"
        time.sleep(0.1)
    worker = int(marker.read_text().split()[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    # Spark's JVM sees its driver gone and takes its Python workers with it.
    deadline = time.monotonic() + 60
    while _alive(worker):
        assert time.monotonic() < deadline, f"python worker {worker} outlived its driver"
        time.sleep(0.2)
    partial = sum(b.ledger().values())
    assert 0 < partial < left
    r = migrate(b)
    assert r.returncode == 0, r.stderr
    assert sum(b.ledger().values()) == left
    delivered_once(b)


def test_move_mode_on_spark_consumes_what_it_delivered(make) -> None:
    b = make(mode="move", batch_size=100)
    left = seed(b, 600)
    r = migrate(b, "--unit-rows", "200")
    assert r.returncode == 0, r.stderr
    subqueues = b.subqueues()
    assert len(subqueues) == left
    quarantined_keys = {int(k) for k in _ledger_keys(b, "quarantined")}
    assert all(s == "X" for k, s in subqueues.items() if k not in quarantined_keys)
    delivered_once(b)


def _ledger_keys(b: Bridge, outcome: str) -> list[str]:
    with b.target.connect() as conn:
        return list(conn.execute(sa.text(
            f"select source_key from \"{b.target_schema}\".qbridge_ledger where outcome = :o"), {"o": outcome}).scalars())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def standalone(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker on loopback, started with PySpark's own launcher."""
    _java()
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port, ui, wui = _free_port(), _free_port(), _free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_WORKER_DIR": str(tmp_path / "work"), "SPARK_LOG_DIR": str(tmp_path / "logs")}
    logs = open(tmp_path / "standalone.log", "wb")
    master = subprocess.Popen([str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=env, stdout=logs, stderr=logs,
                              start_new_session=True)
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen([str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                               "--cores", "2", "--memory", "2g", "--webui-port", str(wui)], env=env, stdout=logs,
                              stderr=logs, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while b"Successfully registered with master" not in (tmp_path / "standalone.log").read_bytes():
            assert master.poll() is None and worker.poll() is None, (tmp_path / "standalone.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "standalone.log").read_text()
            time.sleep(0.3)
        yield url
    finally:
        for p in (worker, master):
            os.killpg(p.pid, signal.SIGTERM)
        for p in (worker, master):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        logs.close()


def test_migrate_through_a_standalone_master_and_worker(make, standalone: str) -> None:
    b = make(batch_size=200)
    left = seed(b, 1500)
    proc = b.spawn("migrate", "--master", standalone, "--unit-rows", "500", env={"SPARK_LOCAL_IP": "127.0.0.1"})
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert f"master {standalone}" in err.decode()
    assert sum(b.ledger().values()) == left
    delivered_once(b)


def test_a_missing_legacy_table_stops_migrate_with_a_clear_error(make) -> None:
    b = make()
    with b.source.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{b.source_schema}"."MQueue1"'))
    r = migrate(b)
    assert r.returncode == 2, r.stderr  # waiting cannot make a table: a setup error, not retried
    assert "NGinn queue table 'MQueue1' not found" in r.stderr and "Traceback" not in r.stderr, r.stderr


STOP_AND_START_AGAIN = """
import threading
from pyspark import SparkContext
from bridge.pipeline.spark import spark_context, stop_spark
sc = spark_context("local[1]")
server = sc._accumulatorServer
stop_spark(sc)
assert SparkContext._active_spark_context is None and sc._jsc is None
# PySpark's accumulator server is shut down on a thread of its own, not in the stop
[closer] = [t for t in threading.enumerate() if t.name == "qbridge-spark-accumulators"]
closer.join(10)
assert not closer.is_alive() and server.socket.fileno() == -1, "the old accumulator server is still open"
# A second context in the same process works, its accumulators included
sc = spark_context("local[1]")
acc = sc.accumulator(0)
sc.parallelize(range(10), 2).foreach(lambda x: acc.add(x))
assert acc.value == 45, acc.value
stop_spark(sc)
print("ok")
"""


def test_spark_stops_without_waiting_for_its_accumulator_server_and_starts_again() -> None:
    done = subprocess.run([sys.executable, "-c", STOP_AND_START_AGAIN], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


WORKER_IMPORTS = """
from bridge.pipeline.spark import spark_context, stop_spark
sc = spark_context("local[2]")
def where(_):
    import pyspark, py4j
    return pyspark.__file__, py4j.__file__
print(sorted(set(sc.parallelize(range(2), 2).map(where).collect())))
def preloaded(_):
    import os, sys
    # this task imports nothing of qbridge: what its worker holds, the daemon imported before the fork
    return os.getpid(), all(m in sys.modules for m in ("bridge.pipeline.units", "bridge.config", "psycopg"))
print("preloaded", sorted(set(sc.parallelize(range(4), 4).map(preloaded).collect())))
stop_spark(sc)
"""


def test_spark_workers_import_the_installed_pyspark_not_its_zip_and_find_the_task_code_imported() -> None:
    import py4j
    import pyspark

    done = subprocess.run([sys.executable, "-c", WORKER_IMPORTS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"('{pyspark.__file__}', '{py4j.__file__}')" in done.stdout, done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("preloaded"))
    workers = eval(line.split(" ", 1)[1])  # noqa: S307 - our own script's printed list
    assert workers and all(ok for _, ok in workers), line


def test_the_spark_daemon_starts_when_the_task_code_does_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.pipeline import spark_daemon

    monkeypatch.setitem(sys.modules, "psycopg", None)  # an import of it raises ImportError
    spark_daemon.preload()  # the worker meets the error on its task, where Spark reports it


def test_pyspark_zips_move_behind_the_installed_package_only_when_they_are_its_own(tmp_path: Path) -> None:
    import pyspark

    from bridge.pipeline.spark_daemon import installed_pyspark_first

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    own = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    site = str(Path(pyspark.__file__).parent.parent)
    assert installed_pyspark_first([*own, "/somewhere", site]) == ["/somewhere", site, *own]
    # A Spark installation of its own (a cluster's SPARK_HOME) keeps its zips first.
    cluster = [str(tmp_path / "spark" / "python" / "lib" / "pyspark.zip"), *own[1:]]
    assert installed_pyspark_first([*cluster, site]) == [*cluster, site]
    # No installed pyspark on the rest of the path: nothing to prefer.
    assert installed_pyspark_first([*own, str(tmp_path)]) == [*own, str(tmp_path)]
    assert installed_pyspark_first([site]) == [site]
