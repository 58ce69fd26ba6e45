"""Review of 444482c (bridge.ledger.sqlite_order): paths that hold two SQLite files' write
locks without the pass-order flock, and so still meet a pass the other way round in a circle.

The demo's two jobs between legacy-nginn.db and nservicebus.db: nginn-orders (legacy -> NServiceBus)
and nginn-replies (NServiceBus -> legacy, move mode). A pass of nginn-replies takes the order flock
(beside legacy-nginn.db, the lower-named), then nservicebus.db, then legacy-nginn.db. The paths
below take legacy-nginn.db, then nservicebus.db, without the flock:

- a Spark unit's batch (Units._unit_batch: `qbridge migrate`, which the demo runs with local[*]);
- a rollback's settling of what a pass left pending, and its give-backs (`qbridge rollback`,
  Leftovers._consume_pending and giveback.finish called outside a pass; also JobSetup.check(),
  which `qbridge run` and `sync` call before the first pass, and quarantine replay's _prepare).

Each test holds the legacy file (thread F, the uncovered path) until the reverse pass holds
nservicebus.db (thread R) or a second has gone by; with a 3 s busy timeout instead of 30 s, a
circle shows as "database is locked" in one of them.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from bridge.commands.main import main as cli_main
from bridge.config import load_config
from bridge.db import engine_for
from bridge.demo.run import build
from bridge.lifecycle.rollback import rollback
from bridge.pipeline.loop import JobRunner
from tests.pipeline.test_consume_pending_lock_order import dies_before_its_source_commit
from tests.pipeline.test_sqlite_pass_order import _reply


def _demo(tmp: Path, forward_mode: str = "copy") -> tuple[Path, Path, Path]:
    config = build(tmp)
    if forward_mode != "copy":  # the first job's mode is nginn-orders'
        config.write_text(config.read_text().replace('mode     = "copy"', f'mode     = "{forward_mode}"', 1))
    assert cli_main(["init", "-c", str(config)]) == 0
    legacy, nsb = tmp / "legacy-nginn.db", tmp / "nservicebus.db"
    with sqlite3.connect(nsb, isolation_level=None) as conn:
        for n in range(3):
            conn.execute('insert into "Sales" (id, headers, body) values (?, ?, ?)', _reply(n))
    return config, legacy, nsb


def _meet(legacy: Path, nsb: Path):
    """The circle, made to happen: thread F, about to begin its transaction in the legacy file
    (`gate`, called just before), waits (up to 2 s) until thread R, started then, has read its
    checkpoint in the legacy file and begun its source transaction in nservicebus.db; R then gives F
    0.3 s to take the legacy file before it asks for it. A 3 s busy timeout on both files instead
    of 30 s. Returns the event R starts on, and the gate."""
    f_ready, r_holds = threading.Event(), threading.Event()
    for path in (legacy, nsb):
        engine = engine_for(f"sqlite:///{path.as_posix()}")
        sa.event.listen(engine, "connect", lambda dbapi, _rec: dbapi.execute("PRAGMA busy_timeout = 3000"))
        engine.dispose()

    def gate() -> None:
        if threading.current_thread().name == "F" and not f_ready.is_set():
            f_ready.set()
            r_holds.wait(2)

    def nsb_begun(conn: sa.Connection) -> None:  # after qbridge's BEGIN IMMEDIATE
        if threading.current_thread().name == "R" and not r_holds.is_set():
            r_holds.set()
            time.sleep(0.3)

    sa.event.listen(engine_for(f"sqlite:///{nsb.as_posix()}"), "begin", nsb_begun)
    return f_ready, gate


def _gated(method, gate):
    def wrapped(*args, **kwargs):
        gate()
        return method(*args, **kwargs)
    return wrapped


def _race(forward, reverse: JobRunner, f_holds: threading.Event) -> list[str]:
    errors: list[str] = []

    def f() -> None:
        try:
            forward()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"F {type(e).__name__}: {str(e)[:160]}")

    def r() -> None:
        try:
            f_holds.wait(10)
            reverse.run_pass("Sales")
        except BaseException as e:  # noqa: BLE001
            errors.append(f"R {type(e).__name__}: {str(e)[:160]}")

    threads = [threading.Thread(target=f, name="F"), threading.Thread(target=r, name="R")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return errors


# Fails on 444482c: a Spark unit's batch locks legacy then NServiceBus without the order flock.
def test_a_spark_unit_and_a_reverse_pass_do_not_wait_on_each_other(tmp_path: Path, caplog) -> None:
    config_path, legacy, nsb = _demo(tmp_path)
    config = load_config(config_path)
    forward, reverse = JobRunner(config, config.job("nginn-orders")), JobRunner(config, config.job("nginn-replies"))
    forward.check()
    reverse.check()
    f_holds, gate = _meet(legacy, nsb)
    forward._in_source_tx = _gated(forward._in_source_tx, gate)  # the unit's batch: legacy, then NServiceBus
    caplog.set_level(logging.WARNING, logger="qbridge")
    started = time.monotonic()
    errors = _race(lambda: forward.run_range("MQueue1", None, 10**9), reverse, f_holds)
    assert not errors, errors
    # The unit's batch is retried inside run_range (with_backoff): the circle shows as a retry
    # after the busy timeout (30 s in production), not as an error.
    assert "database is locked" not in caplog.text, caplog.text
    assert time.monotonic() - started < 2.9
    with sqlite3.connect(nsb) as conn:
        assert conn.execute('select count(*) from "Sales"').fetchone()[0] == 0
        assert conn.execute('select count(*) from "Orders"').fetchone()[0] > 0


# Fails on 444482c: `qbridge rollback` of a move-mode job first consumes what a cut-off pass left
# pending (Leftovers._consume_pending), legacy then NServiceBus, outside any pass and its flock.
def test_a_rollback_settling_pending_keys_and_a_reverse_pass_do_not_wait_on_each_other(tmp_path: Path, monkeypatch) -> None:
    config_path, legacy, nsb = _demo(tmp_path, forward_mode="move")
    config = load_config(config_path)
    forward, reverse = JobRunner(config, config.job("nginn-orders")), JobRunner(config, config.job("nginn-replies"))
    forward.check()
    reverse.check()
    dies_before_its_source_commit(monkeypatch, forward, "MQueue1")

    f_holds, gate = _meet(legacy, nsb)
    forward._consume_checkpoint_pending = _gated(forward._consume_checkpoint_pending, gate)  # legacy, then NServiceBus
    errors = _race(lambda: rollback(forward, "MQueue1", config=config), reverse, f_holds)
    assert not errors, errors
    with sqlite3.connect(nsb) as conn:
        assert conn.execute('select count(*) from "Sales"').fetchone()[0] == 0
