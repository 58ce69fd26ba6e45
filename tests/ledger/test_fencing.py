"""A process that lost its job lock commits nothing that assumed it still held it (issue 35).

Each test runs real `qbridge` processes: one is frozen at a fault point, the session that holds
its job lock is cut (what a failover, an idle-session timeout or a network cut does; on SQLite,
its lock file is removed, as a cleaner of stale files would), another command takes the job and
runs, then the frozen one wakes. Afterwards every message is in NServiceBus exactly once and
`verify` balances."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from helpers import Bridge

pytestmark = pytest.mark.postgres


def _wait(marker: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before its fault point: {proc.communicate()[1].decode()[-3000:]}")
        assert time.monotonic() < deadline, "no fault point reached"
        time.sleep(0.1)


def cut_lock(b: Bridge, command: str, pid: int) -> None:
    """Ends the session that holds the job lock of `qbridge COMMAND` with process id `pid`."""
    if b.target.dialect.name == "sqlite":
        for f in Path(b.target.url.database).parent.glob("*.lock"):
            f.unlink()
        return
    name = f"qbridge {command} on {socket.gethostname()} pid {pid}"[:63]
    with b.target.connect() as conn:
        n = conn.execute(sa.text("select count(pg_terminate_backend(pid)) from pg_stat_activity where application_name = :n"),
                         {"n": name}).scalar()
    assert n == 1, f"no lock session of {name!r}"


def test_a_rollback_beside_a_migrate_whose_lock_was_cut_loses_nothing(make, tmp_path: Path) -> None:
    """The reproduction of issue 35: a move-mode migrate's task sits between its target commit and
    its legacy consume; its lock session is cut; rollback takes the job and withdraws; the task
    wakes and consumes. Before the fix: 0 of 50 in NServiceBus, all 50 'X' in NGinn."""
    b = make(mode="move")
    b.insert(b.ready(50))
    marker = tmp_path / "paused"
    migrate = b.spawn("migrate", env={"QBRIDGE_FAULT_PAUSE": "after_target_commit:1", "QBRIDGE_FAULT_FILE": str(marker),
                                      "QBRIDGE_FAULT_PAUSE_SECONDS": "6"})
    _wait(marker, migrate)
    cut_lock(b, "migrate", migrate.pid)
    rollback = subprocess.run([*b.spawn_args("rollback", "--yes", "--job", "job1")], capture_output=True, text=True, timeout=120)
    _, err = migrate.communicate(timeout=120)
    for _ in range(2):
        assert b.cli("sync", "--once") == 0
    ids = b.message_ids("Orders")
    assert sum(ids.values()) == 50 and set(ids.values()) == {1}, (sum(ids.values()), b.subqueues(), rollback.stdout,
                                                                  rollback.stderr[-2000:], err.decode()[-2000:])
    assert b.cli("verify") == 0
    # The migrate's closing steps assumed it still held the job: refused, with the reason.
    assert migrate.returncode == 1 and "lost the job's lock" in err.decode(), err.decode()[-2000:]
    assert rollback.returncode == 0, rollback.stderr[-2000:]


# -- the cut at each command, with each of the others racing ---------------------------------
COMMANDS = ("migrate", "sync", "run", "rollback", "replay")
# Where each command is frozen: between its target commit and what follows it (a consume, a give-back).
PAUSE_AT = {"migrate": "after_target_commit:1", "sync": "after_target_commit:1", "run": "after_target_commit:1",
            "rollback": "rollback_after_commit:1", "replay": "replay_after_commit:1"}
PAUSE = "3"
FIRST, SECOND = 20, 20  # delivered before the race (rollback's to withdraw), then new (the others' to deliver)


class Race:
    """A queue with FIRST rows delivered and one quarantined (its body is not JSON), SECOND rows
    new; `args(command)` is that command's line, `fixed` the quarantined row as an operator edited it."""

    def __init__(self, b: Bridge, tmp: Path) -> None:
        self.b, self.tmp = b, tmp
        bad = b.ready(1)
        bad[0]["msg_text"] = "{not json"
        b.insert(bad)
        b.insert(b.ready(FIRST, start=2))
        assert b.cli("sync", "--once") == 0
        b.insert(b.ready(SECOND, start=FIRST + 2))
        q = f'"{b.target_schema}".qbridge_quarantine' if b.target_schema else "qbridge_quarantine"
        with b.target.connect() as conn:
            [(self.bad_id, raw)] = conn.execute(sa.text(f"select message_id, raw from {q}")).all()
        fixed = orjson.loads(raw)
        fixed["msg_text"] = '{"$type": "Orders.PlaceOrder, Orders", "Fixed": true}'
        self.fixed = tmp / "fixed.json"
        self.fixed.write_bytes(orjson.dumps(fixed))

    def args(self, command: str) -> list[str]:
        b = self.b
        return {"migrate": b.spawn_args("migrate"), "sync": b.spawn_args("sync", "--once", "--lock-wait", "60"),
                "run": b.spawn_args("run"), "rollback": b.spawn_args("rollback", "--yes", "--job", "job1", "--lock-wait", "60"),
                "replay": b.spawn_args("quarantine", "replay", "--id", self.bad_id, "--with", str(self.fixed))}[command]

    def spawn(self, command: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.args(command), env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def finish(self, command: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> tuple[int, str]:
        """Waits for `proc` (a `run` is stopped once it has had time to work) and returns its exit code and stderr."""
        if command == "run":
            time.sleep(4)
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err.decode(errors="replace")


def _acceptable(command: str, code: int, err: str) -> bool:
    """Exit 0; or 1 because the command lost its job to the racer and said so."""
    return code == 0 or (code == 1 and "lost the job's lock" in err)


def race(b: Bridge, tmp: Path, cut: str, racer: str) -> None:
    r = Race(b, tmp)
    marker = tmp / "paused"
    frozen = r.spawn(cut, {"QBRIDGE_FAULT_PAUSE": PAUSE_AT[cut], "QBRIDGE_FAULT_FILE": str(marker),
                           "QBRIDGE_FAULT_PAUSE_SECONDS": PAUSE})
    _wait(marker, frozen)
    if cut != "replay":  # replay holds no job lock: it serialises on the checkpoint row
        cut_lock(b, cut, frozen.pid)
    other = r.spawn(racer)
    code, err = r.finish(racer, other)
    assert _acceptable(racer, code, err), (racer, code, err[-3000:])
    code, err = r.finish(cut, frozen)
    assert _acceptable(cut, code, err), (cut, code, err[-3000:])
    for _ in range(2):
        assert b.cli("sync", "--once") == 0
    ids = b.message_ids("Orders")
    # The edited message is delivered once if replayed; a rollback after its replay may withdraw
    # it like any other, and the pass after reads its legacy row, as bad as ever, into quarantine.
    replayed = r.bad_id in ids
    assert set(ids.values()) == {1} and len(ids) == FIRST + SECOND + replayed, (len(ids), ids.most_common(3))
    if not replayed:
        q = f'"{b.target_schema}".qbridge_quarantine' if b.target_schema else "qbridge_quarantine"
        with b.target.connect() as conn:
            assert conn.execute(sa.text(f"select message_id from {q}")).scalars().all() == [r.bad_id]
    assert b.cli("verify") == 0
    if b.mode == "move":
        left = [k for k, s in b.subqueues().items() if s != "X"]
        assert len(left) == (0 if replayed else 1), left


PAIRS = [(c, r) for c in COMMANDS for r in COMMANDS if c != r]


@pytest.mark.parametrize("cut,racer", PAIRS, ids=[f"{c}-cut-{r}-races" for c, r in PAIRS])
def test_the_cut_at_each_command_with_each_other_racing_moves_each_message_once(make, tmp_path: Path, cut: str,
                                                                                 racer: str) -> None:
    race(make(mode="move", batch_size=10, schedule='every = "1s"'), tmp_path, cut, racer)


# Copy mode and SQLite: each command cut with rollback racing (the command whose withdrawal a
# lost holder's commits could undo), and rollback cut with a pass or a migration racing.
ROLLBACK_PAIRS = [(c, "rollback") for c in COMMANDS if c != "rollback"] + [("rollback", "sync")]


@pytest.mark.parametrize("cut,racer", ROLLBACK_PAIRS, ids=[f"{c}-cut-{r}-races" for c, r in ROLLBACK_PAIRS])
def test_in_copy_mode_the_cut_at_each_command_beside_a_rollback_moves_each_message_once(make, tmp_path: Path, cut: str,
                                                                                          racer: str) -> None:
    race(make(mode="copy", batch_size=10, schedule='every = "1s"'), tmp_path, cut, racer)


SQLITE_CASES = [(m, c, r) for m in ("move",) for c, r in ROLLBACK_PAIRS] + [
    ("copy", "migrate", "rollback"), ("copy", "rollback", "migrate")]


@pytest.mark.parametrize("mode,cut,racer", SQLITE_CASES, ids=[f"{m}-{c}-cut-{r}-races" for m, c, r in SQLITE_CASES])
def test_on_sqlite_the_cut_at_each_command_beside_another_moves_each_message_once(tmp_path: Path, mode: str, cut: str,
                                                                                   racer: str) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mode=mode, batch_size=10,
               schedule='every = "1s"')
    assert b.cli("init") == 0
    try:
        race(b, tmp_path, cut, racer)
    finally:
        b.dispose()


@pytest.mark.parametrize("server", ["pg", "mariadb"])
def test_a_taker_waits_for_a_checked_transaction_and_the_old_holder_then_fails_its_check(request, server: str) -> None:
    """The fence itself, on PostgreSQL and MariaDB: a transaction that passed its check holds the
    epoch row until it ends, so the next taker's raise waits for it; afterwards every check of
    the old holder fails with LockLost."""
    import threading

    from bridge.errors import LockLost
    from bridge.ledger.fence import jobs_table, take

    if server == "pg":
        url, schema = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_schema")
    else:
        url, schema = request.getfixturevalue("mariadb_database"), None
    engine = sa.create_engine(url)
    try:
        jobs_table(schema).create(engine)
        old = take(engine, schema, "orders", "old holder")
        conn = engine.connect()
        tx = conn.begin()
        old.check(conn)  # passed: holds the row shared until COMMIT
        taken: list = []
        taker = threading.Thread(target=lambda: taken.append(take(engine, schema, "orders", "new holder")))
        taker.start()
        taker.join(1.5)
        assert taker.is_alive() and not taken, "the taker raised the epoch under a checked transaction"
        tx.commit()
        taker.join(10)
        assert taken and taken[0].epoch == old.epoch + 1
        with pytest.raises(LockLost, match="new holder"):
            with conn.begin():
                old.check(conn)
        with conn.begin():
            taken[0].check(conn)
        conn.close()
    finally:
        engine.dispose()
