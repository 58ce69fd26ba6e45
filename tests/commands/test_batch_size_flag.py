"""`sync --once --batch-size N` and `migrate --batch-size N`: rows a transaction for that run only,
in place of each job's `batch_size`; the config, which `qbridge run` keeps using, is left as it is.
A size the config's own `batch_size` could not have is refused with what to give, before anything
moves."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from helpers import Bridge
from tests.pipeline.test_spark_migrate import _java


def _batches(stderr: str) -> list[int]:
    """The rows of each batch a run's INFO lines report, in order."""
    return [int(line.split(" rows=")[1].split()[0]) for line in stderr.splitlines() if " rows=" in line and "delivered=" in line]


def _sync(b: Bridge, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = b.spawn_args("sync", "--once", *args)
    return subprocess.run([*cmd[:3], "--log-level", "INFO", *cmd[3:]], capture_output=True, text=True, timeout=120)


def test_sync_takes_the_flags_size_for_that_run_and_the_configs_after(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    config = b.config.read_text()
    b.insert(b.ready(10))
    r = _sync(b, "--batch-size", "10")
    assert r.returncode == 0, r.stderr
    assert _batches(r.stderr) == [10], r.stderr
    assert b.config.read_text() == config
    b.insert(b.ready(10, start=11))
    r = _sync(b)
    assert r.returncode == 0, r.stderr
    assert _batches(r.stderr) == [4, 4, 2], r.stderr
    assert len(b.message_ids("Orders")) == 20 and set(b.message_ids("Orders").values()) == {1}
    b.dispose()


@pytest.mark.parametrize("size", ["0", "20001"])
def test_a_size_out_of_bounds_is_refused_naming_the_bounds_and_nothing_moves(tmp_path: Path, size: str) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    b.insert(b.ready(5))
    for command in ("sync", "migrate"):
        args = ("sync", "--once") if command == "sync" else ("migrate",)
        r = subprocess.run(b.spawn_args(*args, "--batch-size", size), capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert f"--batch-size {size}: give 1 to 20,000 rows a transaction" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert b.count("Orders") == 0
    b.dispose()


def test_over_sql_servers_limit_is_refused_naming_the_job_and_side(tmp_path: Path) -> None:
    """Refused from the config alone: no SQL Server is reached (none exists here)."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    text = b.config.read_text()
    nsb = f"sqlite:///{tmp_path}/n.db"
    assert nsb in text
    b.config.write_text(text.replace(nsb, "mssql+pyodbc://u:p@127.0.0.1:1/nsb?driver=ODBC+Driver+18+for+SQL+Server"))
    r = subprocess.run(b.spawn_args("sync", "--once", "--batch-size", "5000"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert ("--batch-size 5000: job 'job1''s target is SQL Server, which takes at most 2,000 rows in one statement; "
            "give 2,000 or fewer") in r.stderr, r.stderr
    b.dispose()


@pytest.mark.postgres
def test_migrate_on_spark_runs_its_units_passes_at_the_flags_size(make, tmp_path: Path) -> None:
    """The units run in Spark's Python workers from the config the driver sends them: the flag's
    size has to travel in it. Seen at the unit's first commit, where it pauses until the test has
    counted what that commit wrote."""
    _java()
    b: Bridge = make(batch_size=5)
    b.insert(b.ready(60))
    marker, resume = tmp_path / "paused", tmp_path / "resume"
    proc = b.spawn("migrate", "--batch-size", "30", "--unit-rows", "60", "--master", "local[1]",
                   env={"QBRIDGE_FAULT_PAUSE": "after_target_commit:1", "QBRIDGE_FAULT_FILE": str(marker),
                        "QBRIDGE_FAULT_RESUME_FILE": str(resume), "QBRIDGE_FAULT_PAUSE_SECONDS": "120"})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, "the unit never committed"
            time.sleep(0.1)
        first = b.count("Orders")
    finally:
        resume.touch()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert first == 30
    ids = b.message_ids("Orders")
    assert len(ids) == 60 and set(ids.values()) == {1}
