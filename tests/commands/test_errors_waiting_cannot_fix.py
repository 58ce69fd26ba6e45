"""Errors waiting cannot fix fail at once, exit 2, naming the connection (issue 46.7): a database
or role that does not exist, a refused login, a table missing (SQLite's `no such table` is an
OperationalError, the class of a database that is down). What waiting can fix is retried with
the documented waits: 0.1, 1, 2, 4, 8 s. Before, `database "x" does not exist` was retried five
times over 32 s (1, 2, 4, 8, 16 s) and exited 1.

Each through `python -m bridge`, on the real PostgreSQL, MariaDB (pyodbc) and SQLite."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.demo.samples import create_nginn_queue
from bridge.service.scheduler import JobWorker
from helpers import Bridge


def config(tmp: Path, legacy: str, nsb: str) -> Path:
    (tmp / "m.toml").write_text('[routes]\n"*" = "Orders"\n')
    path = tmp / "c.toml"
    path.write_text(f"""[connections]
legacy = "{legacy}"
nsb = "{nsb}"
[[jobs]]
name = "j"
source = {{ system = "nginn", connection = "legacy", queues = ["MQueue1"], timezone = "UTC" }}
target = {{ connection = "nsb", flavor = "postgresql" }}
mapping = "m.toml"
""")
    return path


def sync(cfg: Path, *more: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "--once", "-c", str(cfg), *more], capture_output=True,
                       text=True, timeout=120)
    return r, time.monotonic() - began


def fails_at_once(cfg: Path, connection: str, *words: str) -> str:
    r, seconds = sync(cfg)
    assert r.returncode == 2, r.stderr
    assert "retrying" not in r.stderr and seconds < 20, (seconds, r.stderr)
    assert f"database {connection!r}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    said = " ".join(r.stderr.split())  # the console folds long lines
    for word in words:
        assert word in said, r.stderr
    return r.stderr


def test_a_postgresql_database_or_role_that_does_not_exist(tmp_path: Path, pg_server: str) -> None:
    nsb = f"sqlite:///{tmp_path}/n.db"
    fails_at_once(config(tmp_path, pg_server.replace("/test", "/qb_no_such_db"), nsb), "legacy", 'database "qb_no_such_db" does not exist',
                  "fix the database or the connection 'legacy'")
    url = sa.engine.make_url(pg_server).set(username="qb_no_such_role", password="x")
    fails_at_once(config(tmp_path, url.render_as_string(hide_password=False), nsb), "legacy", "qb_no_such_role", "***")


def test_mariadb_unknown_database_and_refused_login(tmp_path: Path, mariadb_server: str) -> None:
    nsb = f"sqlite:///{tmp_path}/n.db"
    url = sa.engine.make_url(mariadb_server)
    fails_at_once(config(tmp_path, url.set(database="qb_no_such_db").render_as_string(hide_password=False), nsb), "legacy",
                  "Unknown database")
    fails_at_once(config(tmp_path, url.set(username="qb_nobody", password="x").render_as_string(hide_password=False), nsb),
                  "legacy", "Access denied")


def test_sqlite_tables_missing_on_either_side(tmp_path: Path) -> None:
    legacy, nsb = f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db"
    sa.create_engine(legacy).connect().close()
    fails_at_once(config(tmp_path, legacy, nsb), "legacy", "NGinn queue table 'MQueue1' not found")
    create_nginn_queue(sa.create_engine(legacy), "MQueue1")
    fails_at_once(config(tmp_path, legacy, nsb), "nsb", "no such table: qbridge_", "run `qbridge init`")


def test_a_database_that_does_not_answer_is_retried_with_the_documented_waits(tmp_path: Path) -> None:
    r, _ = sync(config(tmp_path, "postgresql+psycopg://127.0.0.1:1/test", f"sqlite:///{tmp_path}/n.db"), "--retries", "4")
    assert r.returncode == 1, r.stderr
    assert re.findall(r"retrying in ([\d.]+)s", r.stderr) == ["0.1", "1.0", "2.0"], r.stderr
    assert "database 'legacy'" in r.stderr


def test_a_legacy_table_dropped_under_qbridge_run_stops_the_job_saying_why(tmp_path: Path) -> None:
    """Not 'failing' for ever with back-offs: stopped, with SQLite's words, for QBridgeJobStopped."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.insert(b.ready(2))
    worker = JobWorker(b.runner(), stopping=__import__("threading").Event())
    worker.tick()
    assert worker.stopped_reason is None and b.count("Orders") == 2
    with b.source.begin() as conn:
        conn.execute(sa.text('DROP TABLE "MQueue1"'))
    worker.tick()
    assert worker.failures == 0 and worker.stopped_reason and "no such table" in worker.stopped_reason, (
        worker.failures, worker.stopped_reason, worker.last_error)
    worker.lock.release()
