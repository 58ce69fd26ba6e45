"""Fresh-eyes review of `qbridge check` (issue 48): bridge/lifecycle/check.py, check_probes.py,
bridge/commands/check.py, fence.epoch_raise, NServiceBusSource.fetch_after_seq, migrate/run --check.

Each finding was a test that failed on the code as it stood, and passes since its fix:
- the consume probe runs for a key no row has (a MyISAM table keeps what a rollback should undo),
  and a `transactions` probe fails a table without transactions that the job changes, naming
  `ALTER TABLE ... ENGINE=InnoDB`;
- the fence and checkpoint probes run the INSERTs a job's first run makes;
- the target's tables are looked up inside a probe;
- the lock probe takes a session lock under the check's own name (and none on SQLite);
- the read-back pages past what committed meanwhile;
- a reverse OpenJMS write names its own tables' GRANT, and fixes are joined with a space;
- a missing SQLite file is said, not made.
test_guard_* pin what held. Forced
interleavings pause the check at a point of its own code (a wrapper around a Python function of
bridge.lifecycle.check_probes or JobLock), never a stand-in for a database: every statement runs
on the real PostgreSQL, MariaDB and SQLite of the suite.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import Bridge

from bridge.commands.main import main as cli_main
from bridge.ledger.joblock import JobLock
from bridge.lifecycle import check_probes, check_target
from tests.commands.test_secrets_and_privileges import app_role  # noqa: F401 - the fixture
from tests.lifecycle.test_check import as_role_without, snapshot
from tests.systems.test_reverse_openjms import jms2  # noqa: F401 - the fixture


def checked(config: Path, *more: str) -> tuple[int, dict[str, Any] | None]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(["check", "-c", str(config), "--json", *more])
    # the JSON document's line (an in-process sync beside a check in a thread prints here too)
    lines = [line for line in out.getvalue().splitlines() if line.startswith('{"ok"')]
    return code, (json.loads(lines[-1]) if lines else None)


def failed(report: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    return [(p["what"], p["said"], p["fix"]) for p in (report or {"probes": []})["probes"] if not p["ok"]]


def wait_until(what: str, cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# 1. A "rolled back" consume that is not rolled back: a legacy table on a non-transactional engine
# --------------------------------------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.mariadb
def test_consume_probe_on_a_non_transactional_legacy_table_loses_a_waiting_message(
        tmp_path: Path, pg_server: str, pg_schema: str, mariadb_database: str) -> None:
    """CRITICAL (a lost message). The consume probe runs the job's real consume on a real waiting
    row and trusts ROLLBACK to undo it. On MariaDB/MySQL a legacy table in a non-transactional
    engine (MyISAM or Aria: the default engine of MySQL before 5.5, where many OpenJMS and home-grown
    stores were created, and still found after upgrades) ignores ROLLBACK: the probe marks the
    waiting NGinn row processed ('X') for good (an OpenJMS row would be DELETEd), reports "the consume
    ran on a waiting row and was rolled back", exits 0, and the next pass skips the row as processed:
    the message never reaches NServiceBus. The pipeline itself moves such a table (its consume follows
    the target commit). The check must refuse a non-transactional table (information_schema.TABLES.ENGINE /
    the handler's transactions flag) or consume only a key no row has there, never a real row."""
    b = Bridge(tmp_path, mariadb_database, pg_server, target_schema=pg_schema, mode="move")
    try:
        with b.source.begin() as conn:
            conn.execute(sa.text("ALTER TABLE MQueue1 ENGINE=MyISAM"))
        assert b.cli("init") == 0
        b.insert(b.ready(2))
        code, report = checked(b.config)
        left = b.subqueues()
        assert b.cli("sync", "--once") == 0
        moved = b.count("Orders")
    finally:
        b.dispose()
    assert left == {1: "I", 2: "I"}, f"the check's 'rolled back' consume stuck: {left} (check exit {code}, {failed(report)})"
    assert moved == 2, f"only {moved} of 2 waiting messages reached NServiceBus after a check"


# --------------------------------------------------------------------------------------------
# 2. Probes that pass while the statement the job runs would fail
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("table", ["qbridge_jobs", "qbridge_checkpoint"])
def test_a_login_without_insert_on_the_fence_or_checkpoint_passes_check_then_sync_fails(make, app_role: str,
                                                                                        table: str) -> None:
    """MEDIUM (a probe passes while the real statement fails). The fence probe raises the epoch of
    a job no row has (an UPDATE matching nothing) and the checkpoint probe locks a checkpoint no row
    has; neither runs the INSERT a job's first run makes (fence.take inserts the job's qbridge_jobs
    row, ensure_checkpoint its qbridge_checkpoint row). A login without INSERT there passes
    `qbridge check` (exit 0), and the first `sync --once` then stops with 'permission denied': the
    very surprise at cutover that issue 48 is meant to remove. The probe should run the INSERT (of
    the check's own row, rolled back) and name `GRANT INSERT ON ...{table}`."""
    b = make()
    b.insert(b.ready(2))
    as_role_without(b, app_role, "INSERT", b.target_schema, table)
    code, report = checked(b.config)
    synced = b.cli("sync", "--once")
    assert synced != 0  # the job cannot run with this login: the check must have said so
    assert code == 1, f"check passed (exit {code}) though `sync --once` then failed (exit {synced}) on INSERT into {table}"
    assert any(table in fix and "INSERT" in fix for _, _, fix in failed(report)), failed(report)


# --------------------------------------------------------------------------------------------
# 3. Exit codes and the report
# --------------------------------------------------------------------------------------------

def test_an_unreachable_target_is_a_failed_probe_exit_1_not_a_crash_exit_2(tmp_path: Path, pg_server: str) -> None:
    """MEDIUM (exit 2 instead of 1, and no report). target_probes calls init.missing_tables
    outside any probe: when the target does not answer (a login the server refuses, a database
    that is not there, a host down) the OperationalError escapes `check`, main prints one line and
    exits 2 (a config error, by issue 48's contract), and `--json` prints nothing: the connection
    probes that already ran and failed (with their fix) are thrown away. A script gating a cutover on
    exit 1 vs 2 is told the config is broken when the database is. It must be a failed probe, exit 1."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    try:
        assert b.cli("init") == 0
        b.insert(b.ready(2))
        b.config.write_text(b.config.read_text().replace(
            f'nsb    = "sqlite:///{tmp_path}/nsb.db"', 'nsb    = "postgresql+psycopg://qb_no_such_login@127.0.0.1/test"'))
        code, report = checked(b.config)
    finally:
        b.dispose()
    assert report is not None, "--json printed nothing: the probes that ran were lost"
    assert code == 1, f"exit {code}"
    assert any(w == "server" for w, _, _ in failed(report)), failed(report)


# --------------------------------------------------------------------------------------------
# 4. Traces left behind
# --------------------------------------------------------------------------------------------

def test_check_creates_the_sqlite_files_of_a_config_that_names_missing_ones(tmp_path: Path) -> None:
    """LOW-MEDIUM (a trace). The connection probes open each connection with the job's own engine,
    and SQLite creates a missing database file on connect: a check of a config whose target was not
    made yet (or whose legacy path is mistyped) leaves empty nsb.db / legacy files behind. The
    mistyped legacy path then 'exists' (an empty database, where the check said 'table not found'),
    and the 'tables' probe no longer says 'the database file ... itself' (init.missing_tables looks
    for the file after the connection probe made it). Nothing must be created: open SQLite read-only
    (mode=ro, as preview does) where a probe only reads."""
    legacy = tmp_path / "legacy.db"
    b = Bridge(tmp_path, f"sqlite:///{legacy}", f"sqlite:///{tmp_path}/nsb.db")
    try:
        b.insert(b.ready(1))
        b.config.write_text(b.config.read_text().replace(f"sqlite:///{legacy}", f"sqlite:///{tmp_path}/legacy-typo.db"))
        before = sorted(os.listdir(tmp_path))
        code, report = checked(b.config)
    finally:
        b.dispose()
    assert code == 1
    assert sorted(os.listdir(tmp_path)) == before, f"made by the check: {sorted(set(os.listdir(tmp_path)) - set(before))}"
    tables = [said for what, said, _ in failed(report) if what == "tables"]
    assert tables and "the database file" in tables[0], tables


def test_check_appends_its_pid_to_the_jobs_sqlite_lock_file(tmp_path: Path) -> None:
    """LOW (a trace). On SQLite the job-lock probe takes the real job's flock through
    JobLock._flock, which opens the lock file for append and writes the process's pid: every check
    grows the job's lock file by a line naming a process that holds nothing (the check's pid), the
    file an operator reads to see who holds the job. The probe must leave the file byte for byte."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    try:
        assert b.cli("init") == 0
        b.insert(b.ready(1))
        assert b.cli("sync", "--once") == 0  # the job's first run makes its lock file
        [lock] = [p for p in tmp_path.iterdir() if ".qbridge.job." in p.name]  # not the passes' order lock
        before = lock.read_bytes()
        code, _ = checked(b.config)
        after = lock.read_bytes()
    finally:
        b.dispose()
    assert code == 0
    assert after == before, f"{lock.name}: {before!r} -> {after!r}"


# --------------------------------------------------------------------------------------------
# 5. Interleavings with a live `qbridge run` / `sync --once`
# --------------------------------------------------------------------------------------------

def _check_in_thread(config: Path) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def go() -> None:
        result["code"], result["report"] = checked(config)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, result


def test_the_lock_probe_takes_the_real_jobs_lock_and_a_starting_run_stands_by_for_a_whole_schedule(
        make, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEDIUM (a live job stalled for a schedule interval). The job-lock probe takes the real job's
    session lock (pg_try_advisory_lock / GET_LOCK / sp_getapplock, or its flock). A `qbridge run`
    whose tick comes while the check holds it finds the job held, logs 'another qbridge run holds
    this job; standing by' and does nothing until its NEXT scheduled tick: with an hourly schedule the
    job stands still for an hour after a check run on another host (the same for a standby taking over).
    The lock statement needs no real job to be proven: the probe can take the lock of CHECK_JOB, a
    name no job has, as the fence probe does. (The check is held here at the moment it holds the
    lock; in the wild the window is that of its round trips, and a run's first tick is at its start.)"""
    b = make(schedule='every = "1h"')
    b.insert(b.ready(3))
    holding, go_on = threading.Event(), threading.Event()
    original = JobLock.release

    def slow_release(self: JobLock) -> None:
        if self.who == "qbridge check" and self.held:
            holding.set()
            go_on.wait(30)
        original(self)

    monkeypatch.setattr(JobLock, "release", slow_release)
    t, result = _check_in_thread(b.config)
    proc = None
    try:
        assert holding.wait(60), "the check never took the job's lock"
        proc = b.spawn("run")
        time.sleep(6)  # its first tick (at start) finds the job held
        go_on.set()
        t.join(60)
        assert result.get("code") == 0, failed(result.get("report"))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and b.count("Orders") < 3:
            time.sleep(0.2)
        moved = b.count("Orders")
    finally:
        go_on.set()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert moved == 3, f"the run stood by after the check let the job go: {moved} of 3 moved 15 s later (next tick in 1h)"


def test_a_batch_committed_into_the_queue_during_the_write_probe_fails_the_check(
        make, monkeypatch: pytest.MonkeyPatch) -> None:
    """MEDIUM-LOW (check fails beside a live job; `run --check` then refuses to start). The write
    probe notes the queue's newest seq (_head), inserts its row, and looks for it with
    fetch_after_seq(before, limit 10). A live pass's batch whose rows took seqs before the probe's
    row and commit inside that window (a batch of a running `qbridge run` on another host) fills those
    10 places: 'the transport's receive did not find the row just written', exit 1, though every
    statement works. The read-back must look for the probe's own row (its seq is known: RETURNING,
    or its MessageId), not the first rows after a seq read before its insert."""
    b = make(batch_size=50)
    b.insert(b.ready(12))
    paused, go_on = threading.Event(), threading.Event()
    original = check_target._head

    def slow_head(runner: Any, conn: Any, kind: str, table_queue: str) -> Any:
        before = original(runner, conn, kind, table_queue)
        if kind == "queue" and table_queue == "Orders" and not paused.is_set():
            paused.set()
            go_on.wait(60)
        return before

    monkeypatch.setattr(check_target, "_head", slow_head)
    t, result = _check_in_thread(b.config)
    try:
        assert paused.wait(60)
        # the live pass's batch into Orders commits between the check's _head and its insert
        r = subprocess.run(b.spawn_args("sync", "--once"), capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        assert b.count("Orders") == 12
    finally:
        go_on.set()
        t.join(60)
    assert result.get("code") == 0, failed(result.get("report"))


def test_guard_a_pass_reads_past_the_row_the_consume_probe_holds_and_still_moves_it(
        make, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard. The consume probe holds a real waiting NGinn row (move mode) while `sync --once` runs
    with late_commit_window = 1s: the pass's skip-locked read steps over it (a gap), the next pass,
    once the window is over, finds the committed row there (keys_in) and keeps the gap, and once the
    check has rolled back the row is moved: nothing lost, nothing doubled, the row consumed once."""
    b = make(mode="move", window="1s")
    b.insert(b.ready(3))
    holding, go_on = threading.Event(), threading.Event()
    original = check_probes.rolled_back

    from contextlib import contextmanager

    @contextmanager
    def held_after_consume(engine: sa.Engine):  # type: ignore[no-untyped-def]
        with original(engine) as conn:
            yield conn
            if any("SET subqueue" in str(c) for c in executed):
                holding.set()
                go_on.wait(60)

    executed: list[Any] = []

    def record(conn: Any, clause: Any, *a: Any, **k: Any) -> None:
        executed.append(clause)

    monkeypatch.setattr(check_probes, "rolled_back", held_after_consume)
    engine = b.runner().source_engine  # bridge.db's cached engine: the one the check uses
    sa.event.listen(engine, "before_execute", record)
    t, result = _check_in_thread(b.config)
    try:
        assert holding.wait(60), "the consume probe never ran"
        assert b.cli("sync", "--once") == 0
        time.sleep(1.5)
        assert b.cli("sync", "--once") == 0  # the gap's window is over while the row is still held
    finally:
        go_on.set()
        t.join(60)
        sa.event.remove(engine, "before_execute", record)
    assert result.get("code") == 0, failed(result.get("report"))
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 3 and sorted(b.message_ids("Orders").values()) == [1, 1, 1]
    assert set(b.subqueues().values()) == {"X"}


# --------------------------------------------------------------------------------------------
# 6. A check killed mid-probe
# --------------------------------------------------------------------------------------------

KILLED_CHECK = textwrap.dedent("""
    import sys, time, pathlib
    from bridge.lifecycle import check_target
    from bridge.commands.main import main
    marker = pathlib.Path(sys.argv[1])
    original = check_target._read_back_as_endpoint
    def stuck(*args):
        original(*args)
        marker.write_text("in the write probe")
        time.sleep(3600)
    check_target._read_back_as_endpoint = stuck
    main(["check", "-c", sys.argv[2]])
""")


@pytest.mark.parametrize("where", ["postgres", "sqlite"])
def test_guard_a_check_killed_in_its_write_probe_leaves_nothing(where: str, make, tmp_path: Path) -> None:
    """Guard. SIGKILL while the write probe holds its row in the queue, the ledger, range and
    quarantine entries and the checkpoint lock: the database rolls the transaction back (PostgreSQL
    when the session ends; SQLite's hot journal at the next open), no row stays, and a sync runs
    at once and moves every message exactly once."""
    if where == "postgres":
        b = make(mode="move")
    else:
        b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mode="move")
        assert b.cli("init") == 0
    try:
        b.insert(b.ready(3))
        schemas = [(b.source, b.source_schema), (b.target, b.target_schema)]
        before = snapshot(schemas)
        marker = tmp_path / "in-probe"
        proc = subprocess.Popen([sys.executable, "-c", KILLED_CHECK, str(marker), str(b.config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_until("the check's write probe", lambda: marker.exists() or proc.poll() is not None, 60)
            assert proc.poll() is None, proc.communicate()
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        assert snapshot(schemas) == before
        assert b.cli("sync", "--once", "--lock-wait", "5") == 0
        assert b.count("Orders") == 3 and sorted(b.message_ids("Orders").values()) == [1, 1, 1]
        assert not [r for r in b.rows("Orders") if "QBridge.Check" in r["headers"]]
        with b.target.begin() as conn:  # the books: only the job's own
            jobs = {j for (j,) in conn.execute(sa.text(f"select distinct job from {b._qualified('qbridge_ledger')}"))}
            cps = {j for (j,) in conn.execute(sa.text(f"select distinct job from {b._qualified('qbridge_checkpoint')}"))}
        assert jobs <= {"job1"} and cps == {"job1"}
    finally:
        if where == "sqlite":
            b.dispose()


def test_guard_check_beside_a_sync_leaves_the_books_and_the_fence_as_they_were(make) -> None:
    """Guard. A check after a sync leaves qbridge_jobs (the epoch), the checkpoint and every
    other table as they were, and the next sync takes the job at once."""
    b = make(mode="move")
    b.insert(b.ready(2))
    assert b.cli("sync", "--once") == 0
    b.insert(b.ready(2, start=3))
    schemas = [(b.source, b.source_schema), (b.target, b.target_schema)]
    before = snapshot(schemas)
    code, report = checked(b.config)
    assert code == 0, failed(report)
    assert snapshot(schemas) == before
    assert b.cli("sync", "--once", "--lock-wait", "0") == 0 and b.count("Orders") == 4


# --------------------------------------------------------------------------------------------
# 7. The fix a failure names
# --------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.mariadb
def test_a_reverse_openjms_login_without_insert_on_messages_is_told_that_grant(jms2, mariadb_database: str) -> None:
    """MEDIUM-LOW (a wrong fix). A reverse job into OpenJMS whose login may not INSERT into the
    store's `messages` table fails the write probe ('INSERT command denied ... for table messages'),
    but the fix names every one of qbridge's state tables instead: _queue_needs asks the target for
    its tables(), which OpenJMSTarget answers with [] (the store is OpenJMS's own), so fix_for falls
    back to the state tables' GRANTs (SELECT, INSERT, UPDATE, DELETE on qbridge_ledger, ...), all of
    which the login already has, and never `GRANT INSERT ON messages`. Issue 48: 'a login without
    INSERT on a queue ... fail[s] with the exact GRANT'."""
    import uuid

    user = f"qbck_{uuid.uuid4().hex[:8]}"
    db = sa.engine.make_url(mariadb_database).database
    root = sa.create_engine(mariadb_database)
    try:
        with root.begin() as conn:
            conn.execute(sa.text(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
            conn.execute(sa.text(f"CREATE USER '{user}'@'localhost' IDENTIFIED BY 'pw'"))
            for host in ("%", "localhost"):
                for name in sa.inspect(conn).get_table_names():
                    rights = "SELECT, UPDATE, DELETE" if name == "messages" else "SELECT, INSERT, UPDATE, DELETE"
                    conn.execute(sa.text(f"GRANT {rights} ON `{db}`.`{name}` TO '{user}'@'{host}'"))
        url = mariadb_database.replace("root:@", f"{user}:pw@")
        jms2.config.write_text(jms2.config.read_text().replace(f'jms = "{mariadb_database}"', f'jms = "{url}"'))
        code, report = checked(jms2.config, "--job", "to-jms")
    finally:
        with root.begin() as conn:
            for host in ("%", "localhost"):
                conn.execute(sa.text(f"DROP USER IF EXISTS '{user}'@'{host}'"))
        root.dispose()
    bad = [(w, s, f) for w, s, f in failed(report) if "denied" in s]
    assert code == 1 and bad, failed(report)
    for what, said, fix in bad:
        assert "messages" in said, (what, said)
        assert fix.startswith("GRANT INSERT ON ") and "messages" in fix and "qbridge_" not in fix, (what, fix)
