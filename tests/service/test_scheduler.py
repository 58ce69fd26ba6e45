"""`qbridge run`: schedules, the per-job database lock, back-off, clean stops, and a soak test
with writers, a SIGKILLed scheduler and a PostgreSQL restart."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from bridge.config import load_config
from bridge.errors import ConfigError
from bridge.ledger.joblock import JobLock, acquire_statement
from bridge.pipeline.loop import JobRunner
from bridge.service.scheduler import JobWorker, trigger_for
from helpers import Bridge

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def wait_for(what: str, check, timeout: float = 60, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"qbridge exited ({proc.returncode}) while waiting for {what}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Log:
    """A child's stderr, read on a thread so the pipe never fills."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line.decode(errors="replace").rstrip())

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def __str__(self) -> str:
        return "\n".join(self.lines[-60:])


def run(b: Bridge, *args: str) -> tuple[subprocess.Popen[bytes], Log]:
    proc = b.spawn("run", *args)
    return proc, Log(proc)


def stop(proc: subprocess.Popen[bytes], log: Log) -> int:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    time.sleep(0.2)
    return code


# -- config and triggers ---------------------------------------------------------------------
def test_schedules_become_interval_and_cron_triggers(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "1s"')
    assert "interval[0:00:01]" in str(trigger_for(load_config(b.config).jobs[0]))
    b.schedule = 'cron = "*/5 * * * *"'
    b.write_config()
    assert "minute='*/5'" in str(trigger_for(load_config(b.config).jobs[0]))
    b.schedule = 'cron = "*/5 * *"'
    b.write_config()
    with pytest.raises(ConfigError, match=r"jobs\[0\].schedule.*not a crontab expression"):
        load_config(b.config)
    b.dispose()


# -- the job lock ----------------------------------------------------------------------------
def _two_locks(url: str) -> None:
    e1, e2 = sa.create_engine(url), sa.create_engine(url)
    # Names of this test's own: MariaDB's GET_LOCK names are the server's, and a test on the other
    # worker running a job named "orders" took the freed lock between release and ensure once.
    name = f"orders-{uuid.uuid4().hex[:8]}"
    first, second = JobLock(e1, name), JobLock(e2, name)
    other = JobLock(e2, f"billing-{name}")
    try:
        assert first.ensure() and first.ensure()
        assert not second.ensure(), "two holders of one job's lock"
        assert other.ensure(), "a different job's lock is independent"
        first.release()
        assert second.ensure(), "a released lock is free for the standby"
    finally:
        for lock in (first, second, other):
            lock.release()
        e1.dispose()
        e2.dispose()


def test_job_lock_on_postgresql(pg_server: str) -> None:
    _two_locks(pg_server)


def test_job_lock_on_mariadb(mariadb_server: str) -> None:
    _two_locks(mariadb_server)


def test_job_lock_on_sqlite(tmp_path: Path) -> None:
    _two_locks(f"sqlite:///{tmp_path}/nsb.db")


def test_job_lock_statement_for_sql_server() -> None:
    sql, params = acquire_statement("mssql", "qbridge.job.orders")
    assert "sp_getapplock" in sql and "@LockOwner = 'Session'" in sql and "@LockTimeout = 0" in sql
    assert params == {"name": "qbridge.job.orders"}


def test_a_dead_holder_frees_the_lock_at_once(pg_server: str, tmp_path: Path) -> None:
    script = ("import sys, time, sqlalchemy as sa; from bridge.ledger.joblock import JobLock; "
              f"l = JobLock(sa.create_engine({pg_server!r}), 'dies'); assert l.ensure(); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([os.sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
    engine = sa.create_engine(pg_server)
    standby = JobLock(engine, "dies")
    try:
        assert not standby.ensure()
        proc.kill()
        proc.wait()
        wait_for("the server to free a dead session's lock", standby.ensure, timeout=10)
    finally:
        standby.release()
        engine.dispose()


# -- back-off, stopping, other jobs running on -------------------------------------------------
def test_retryable_failures_back_off_with_one_line_each(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A legacy PostgreSQL that refuses connections: a real network failure, nothing mocked.
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.source_url = "postgresql+psycopg://qbridge:secret@127.0.0.1:1/legacy"
    b.write_config()
    config = load_config(b.config)
    now = [0.0]
    worker = JobWorker(JobRunner(config, config.jobs[0]), threading.Event(), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="qbridge.run"):
        worker.tick()
        worker.tick()  # inside the back-off: not attempted
        now[0] = 1.5
        worker.tick()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "attempt 1 failed" in lines[0] and "retrying in 1s" in lines[0]
    assert "attempt 2 failed" in lines[1] and "retrying in 2s" in lines[1]
    assert all("secret" not in line for line in lines)
    assert worker.stopped_reason is None
    worker.lock.release()
    b.dispose()


def test_a_broken_job_stops_and_the_other_keeps_running(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "1s"')
    assert b.cli("init") == 0
    text = b.config.read_text()
    broken = text.split("[[jobs]]")[1].replace('name     = "job1"', 'name     = "broken"').replace('"MQueue1"', '"NoSuchTable"')
    b.config.write_text(text + "\n[[jobs]]" + broken)
    proc, log = run(b)
    try:
        wait_for("the broken job to stop", lambda: log.has("job=broken stopped"), proc=proc)
        assert log.has("NoSuchTable")
        b.insert(b.ready(5))
        wait_for("job1 to keep syncing", lambda: b.count("Orders") == 5, proc=proc)
    finally:
        assert stop(proc, log) == 0, str(log)
    b.dispose()


def test_run_syncs_on_schedule_logs_each_batch_and_stops_cleanly(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "1s"', batch_size=50)
    assert b.cli("init") == 0
    b.insert(b.ready(120))
    proc, log = run(b)
    try:
        wait_for("the first rows", lambda: b.count("Orders") == 120, proc=proc)
        b.insert(b.ready(7, start=200))
        wait_for("rows inserted while running", lambda: b.count("Orders") == 127, proc=proc)
    finally:
        code = stop(proc, log)
    assert code == 0, str(log)
    batch = [line for line in log.lines if "job=job1 queue=MQueue1 rows=" in line]
    assert len(batch) >= 4, str(log)  # 50 + 50 + 20, then 7
    assert all("lag=" in line and "duration=" in line for line in batch)
    assert log.has("SIGTERM received") and log.has("stopped cleanly")
    assert b.cli("verify") == 0
    b.dispose()


@pytest.mark.slow
def test_sigterm_mid_batch_finishes_the_batch_and_exits_0(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema,
               schedule='every = "1s"', batch_size=100)
    assert b.cli("init") == 0
    b.insert(b.ready(300))
    marker = tmp_path / "paused"
    # Freeze the 2nd batch just before its commit, send SIGTERM, then let it go on.
    proc = b.spawn("run", env={"QBRIDGE_FAULT_PAUSE": "before_target_commit:2", "QBRIDGE_FAULT_FILE": str(marker),
                               "QBRIDGE_FAULT_PAUSE_SECONDS": "3"})
    log = Log(proc)
    wait_for("the second batch", marker.exists, proc=proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, str(log)
    assert b.count("Orders") == 200, "the batch in flight commits; no new batch starts"
    assert b.cli("verify") == 0  # backlog left, nothing missing
    b.dispose()


# -- two schedulers, one config ------------------------------------------------------------------
@pytest.mark.slow
def test_second_run_stands_by_and_takes_over_when_the_first_is_killed(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, schedule='every = "1s"')
    assert b.cli("init") == 0
    first, first_log = run(b)
    b.insert(b.ready(10))
    wait_for("the first scheduler", lambda: b.count("Orders") == 10, proc=first)
    second, second_log = run(b)
    try:
        wait_for("the standby", lambda: second_log.has("standing by"), proc=second)
        b.insert(b.ready(10, start=100))
        wait_for("more rows", lambda: b.count("Orders") == 20, proc=second)
        assert not second_log.has("rows="), "the standby ran the job while the first held it"
        first.kill()
        first.wait()
        b.insert(b.ready(10, start=200))
        wait_for("the take-over", lambda: b.count("Orders") == 30, proc=second, timeout=30)
        assert second_log.has("lock taken over")
    finally:
        assert stop(second, second_log) == 0, str(second_log)
    ids = b.message_ids("Orders")
    assert len(ids) == 30 and set(ids.values()) == {1}
    b.dispose()


# -- soak -----------------------------------------------------------------------------------------
def _can_restart_postgresql() -> None:
    if shutil.which("pg_ctlcluster") is None or os.geteuid() != 0:
        if IN_CI:
            pytest.fail("the soak test restarts PostgreSQL and needs pg_ctlcluster as root")
        pytest.skip("the soak test restarts PostgreSQL and needs pg_ctlcluster as root")


def _restart_postgresql() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"], check=True)
    for _ in range(60):
        if subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError("PostgreSQL did not come back")


class Writer(threading.Thread):
    """Inserts NGinn rows into one queue table at a steady rate, riding out database outages."""

    def __init__(self, b: Bridge, queue: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.b, self.queue, self.rate = b, queue, rate
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        engine = sa.create_engine(self.b.source_url, pool_pre_ping=True)
        n = 0
        while not self.stop.is_set():
            try:
                with engine.begin() as conn:
                    conn.execute(self.b.tables[self.queue].insert(), self.b.ready(5, self.queue, start=n))
                n += 5
            except sa.exc.DBAPIError:
                self.errors += 1
                time.sleep(0.2)
            self.stop.wait(5 / self.rate)
        engine.dispose()


@pytest.mark.restarts_postgres
@pytest.mark.slow
def test_soak_writers_killed_scheduler_and_postgresql_restart(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    _can_restart_postgresql()
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema,
               queues=["MQueue1", "MQueue2"], schedule='every = "1s"', batch_size=200)
    text = b.config.read_text()
    job2 = text.split("[[jobs]]")[1].replace('name     = "job1"', 'name     = "job2"').replace('queues = ["MQueue1", "MQueue2"]', 'queues = ["MQueue2"]')
    b.config.write_text(text.replace('queues = ["MQueue1", "MQueue2"]', 'queues = ["MQueue1"]') + "\n[[jobs]]" + job2)
    assert b.cli("init") == 0
    writers = [Writer(b, "MQueue1", 150), Writer(b, "MQueue2", 100)]
    for w in writers:
        w.start()
    first, first_log = run(b)
    second = second_log = None
    try:
        time.sleep(4)
        second, second_log = run(b)
        time.sleep(4)
        first.kill()  # SIGKILL midway: whatever it had in flight rolls back or is in the ledger
        first.wait()
        time.sleep(3)
        _restart_postgresql()
        time.sleep(6)
        for w in writers:
            w.stop.set()
            w.join()
        with b.source.connect() as conn:
            expected = sum(conn.execute(sa.select(sa.func.count()).select_from(b.tables[q])).scalar_one() for q in ("MQueue1", "MQueue2"))
        wait_for("the scheduler to catch up", lambda: sum(b.ledger().values()) == expected, proc=second, timeout=90)
        assert second_log.has("connection was lost"), "the restart went unnoticed: " + str(second_log)
    finally:
        for w in writers:
            w.stop.set()
        if first.poll() is None:
            first.kill()
        if second is not None:
            assert stop(second, second_log) == 0, str(second_log)
    ids = b.message_ids("Orders", "Billing")
    assert len(ids) == expected, f"{len(ids)} distinct messages for {expected} legacy rows"
    assert set(ids.values()) == {1}, "a message arrived twice"
    assert b.cli("verify") == 0
    status = subprocess.run([os.sys.executable, "-m", "bridge", "status", "-c", str(b.config), "--json"],
                            capture_output=True, check=True)
    jobs = {j["job"]: j for j in orjson.loads(status.stdout)["jobs"]}
    assert jobs["job1"]["backlog"] == 0 and jobs["job2"]["backlog"] == 0
    assert jobs["job1"]["rows_moved"] + jobs["job2"]["rows_moved"] == expected
    b.dispose()
