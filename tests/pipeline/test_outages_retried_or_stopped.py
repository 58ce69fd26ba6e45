"""Faults a careful operator tries: the target restarted mid-batch, the source unreachable, a
statement timeout, a full disk. qbridge retries or stops cleanly, and a re-run finishes with
every message exactly once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = pytest.mark.slow


def exactly_once(b: Bridge, expected: int) -> None:
    ids = b.message_ids("Orders")
    assert len(ids) == expected and set(ids.values()) == {1}
    assert b.cli("verify") == 0


@pytest.fixture()
def pg_bridge(pg_server: str, pg_schema: str, tmp_path: Path):
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, batch_size=100)
    assert b.cli("init") == 0
    yield b
    b.dispose()


@pytest.mark.restarts_postgres
def test_target_restarted_mid_batch_is_retried_and_nothing_doubles(pg_bridge: Bridge, tmp_path: Path) -> None:
    if shutil.which("pg_ctlcluster") is None or os.geteuid() != 0:
        (pytest.fail if IN_CI else pytest.skip)("restarting PostgreSQL needs pg_ctlcluster as root")
    b = pg_bridge
    b.insert(b.ready(300))
    marker = tmp_path / "paused"
    proc = b.spawn("sync", "--once", env={"QBRIDGE_FAULT_PAUSE": "before_target_commit:2", "QBRIDGE_FAULT_FILE": str(marker),
                                          "QBRIDGE_FAULT_PAUSE_SECONDS": "2"})
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"], check=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"retrying" in err, "the lost batch was not retried: " + err.decode()
    exactly_once(b, 300)


def test_source_unreachable_stops_cleanly_naming_the_connection(pg_bridge: Bridge) -> None:
    b = pg_bridge
    b.config.write_text(b.config.read_text().replace(f'legacy = "{b.source_url}"', 'legacy = "postgresql+psycopg://qb:pw@127.0.0.1:1/legacy"'))
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "-c", str(b.config), "--once", "--retries", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "legacy" in r.stderr and "attempt 1 of 2" in r.stderr and "pw@" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_statement_timeout_is_retried_until_the_lock_is_gone(pg_bridge: Bridge) -> None:
    b = pg_bridge
    b.insert(b.ready(50))
    # qbridge's sessions time out after 300 ms; someone else holds the checkpoint row for 2.5 s.
    url = b.target_url + ("&" if "?" in b.target_url else "?") + "options=-c%20statement_timeout%3D300"
    b.config.write_text(b.config.read_text().replace(f'nsb    = "{b.target_url}"', f'nsb    = "{url}"'))
    assert b.cli("sync", "--once") == 0  # creates the checkpoint row
    b.insert(b.ready(50, start=100))
    holder = b.target.connect()
    tx = holder.begin()
    holder.execute(sa.text(f'select * from "{b.target_schema}".qbridge_checkpoint for update'))
    threading.Timer(2.5, tx.rollback).start()
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "-c", str(b.config), "--once"],
                       capture_output=True, text=True, timeout=120)
    holder.close()
    assert r.returncode == 0, r.stderr
    assert "statement timeout" in r.stderr and "retrying" in r.stderr, r.stderr
    exactly_once(b, 100)


def test_a_full_disk_stops_cleanly_and_a_rerun_after_freeing_space_finishes(pg_bridge: Bridge, tmp_path: Path) -> None:
    """The target's queue table lives in a tablespace on an 8 MB tmpfs."""
    b = pg_bridge
    mount = Path(f"/tmp/qbridge-full-{uuid.uuid4().hex[:8]}")
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a small tmpfs here to fill up ({made.stderr.strip()}); the database allows it, the sandbox does not")
    space = f"qbfull_{uuid.uuid4().hex[:8]}"
    table = f'"{b.target_schema}"."Orders"'
    try:
        shutil.chown(mount, "postgres", "postgres")
        with b.target.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"CREATE TABLESPACE {space} LOCATION '{mount}'"))
            conn.execute(sa.text(f"ALTER TABLE {table} SET TABLESPACE {space}"))
        b.insert([{**r, "msg_text": '{"$type":"Orders.PlaceOrder, Orders","Pad":"' + os.urandom(20_000).hex() + '"}'}
                  for r in b.ready(400)])  # about 16 MB of bodies: more than the disk holds
        r = subprocess.run([sys.executable, "-m", "bridge", "sync", "-c", str(b.config), "--once", "--retries", "2"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        assert "No space left on device" in r.stderr or "could not extend" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        partial = b.count("Orders")
        assert sum(b.ledger().values()) == partial, "ledger and queue rows committed together or not at all"
        with b.target.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"ALTER TABLE {table} SET TABLESPACE pg_default"))
        assert b.cli("sync", "--once") == 0
        exactly_once(b, 400)
    finally:
        with b.target.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"ALTER TABLE {table} SET TABLESPACE pg_default"))
            conn.execute(sa.text(f"DROP TABLESPACE IF EXISTS {space}"))
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()
