"""Review of a63fe94 (`ranges_upgrade.unfolded` counts every entry without a bit, whatever its
outcome) and c98cfa0 (bridge/pipeline/lane_imports.py: the lane's modules imported by the thread
that starts a read-ahead, and by `qbridge run` before its scheduler's first ticks).

Each test says whether it FAILED (a finding, fixed since) or PASSES (a guard: checked and found sound).
"""

from __future__ import annotations

import sys
import uuid
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import (
    BY_TYPE,
    FIXED,
    IMPORT_SPY,
    MAPPING,
    each_once_after_a_re_read_and_replay,
    entries_without_bits,
    run_two_jobs,
    unfold_ranges,
    unrouted_rows,
)

from bridge.ledger import ranges_upgrade
from bridge.ledger.ranges import Ranges
from bridge.ledger.state import LEDGER_COLUMNS
from bridge.lifecycle.quarantine import QuarantineDesk
from bridge.pipeline import lane_imports
from bridge.targets.bulk import insert_values

QUEUE = "MQueue1"





# -- a63fe94: the fold and `unfolded` --------------------------------------------------------------


def test_guard_a_fold_cut_off_at_every_transaction_resumes_and_every_entry_gets_its_bit(make, monkeypatch) -> None:
    """PASSES (guard). Range ledger made by a DBA beside an earlier qbridge's entries (delivered,
    a replayed quarantined one without a bit, two quarantined), folded two entries a transaction:
    init killed inside its k-th transaction for every k. Until the fold is whole, every command
    refuses (status), and the finished fold leaves no entry without a bit; a copy pass reading the
    queue again and the replay then deliver each message once."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {3, 5, 7}, 9))
    assert b.cli("sync", "--once") == 0
    b.mapping = FIXED
    b.write_config()
    runner = b.runner()
    desk = QuarantineDesk(runner, "ops", None)
    [row] = [q for q in desk._rows(None) if q["source_key"] == "3"]
    [o] = desk.replay([row["message_id"]])
    assert o.action == "replayed"
    b.mapping = BY_TYPE
    b.write_config()
    assert unfold_ranges(b) == 6  # 6 delivered keys become entries; key 3's entry (replayed) and 5, 7 (quarantined) stay
    b.runner().state.ranges.table.create(b.target)
    monkeypatch.setattr(ranges_upgrade, "CHUNK", 2)

    class Killed(BaseException):
        pass

    k, done = 1, False
    while not done:
        calls = {"n": 0}

        class KilledAt(Ranges):
            def mark(self, *a: Any, **kw: Any) -> None:
                calls["n"] += 1
                if calls["n"] == k:
                    raise Killed(f"init killed in its transaction {k}")
                super().mark(*a, **kw)

        monkeypatch.setattr(ranges_upgrade, "Ranges", KilledAt)
        try:
            b.cli("init")
            done = True
        except Killed:
            assert b.cli("status") != 0, f"a command ran on a fold cut off in transaction {k}"
        monkeypatch.setattr(ranges_upgrade, "Ranges", Ranges)
        k += 1
    assert k > 4
    assert b.cli("init") == 0 and b.cli("status") == 0
    assert entries_without_bits(b) == []

    each_once_after_a_re_read_and_replay(b, 9, FIXED)


def test_guard_normal_operations_on_a_ranged_queue_never_leave_an_entry_without_its_bit(make) -> None:
    """PASSES (guard). Quarantine, replay, discard, rollback (entries and bits withdrawn together),
    a second sync: no entry of the queue lacks a bit afterwards, so `unfolded` never makes every
    command refuse after a normal operation."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {2, 4, 6}, 8))
    assert b.cli("sync", "--once") == 0
    b.mapping = FIXED
    b.write_config()
    desk = QuarantineDesk(b.runner(), "ops", "no longer wanted")
    rows = sorted(desk._rows(None), key=lambda q: int(q["source_key"]))
    assert desk.replay([rows[0]["message_id"]])[0].action == "replayed"
    assert desk.discard([rows[1]["message_id"]])[0].action == "discarded"
    assert entries_without_bits(b) == [] and b.cli("status") == 0
    assert b.cli("rollback", "--job", "job1", "--yes") == 0
    assert entries_without_bits(b) == [] and b.cli("status") == 0
    assert b.cli("sync", "--once") == 0
    assert entries_without_bits(b) == [] and b.cli("status") == 0 and b.cli("verify") == 0


def test_check_ledger_reads_every_quarantined_entry_of_a_folded_queue(make) -> None:
    """FAILED (cost, not correctness; fixed by 413e9fd). Since a63fe94 `unfolded` reads EVERY entry of a ranged queue
    (before: its delivered/skipped ones only, on a folded queue the released quarantined ones), and
    looks their bits up, 10,000 a round: `JobSetup.check_ledger` costs O(entries) once per runner,
    i.e. at every command's start, each `run` job and reload, each status-page replay. A folded
    queue's entries are its quarantined messages, which prune never removes (ranged queues are
    skipped) and a replay or discard keeps: an unroutable type that quarantines a few million
    messages makes every command read all of them first (measured here: 100k entries 0.4 s,
    400k entries 2.8 s). The statements it issues should not grow with the quarantine."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {1, 2, 3}, 3))
    assert b.cli("sync", "--once") == 0 and b.ledger() == {"quarantined": 3}

    def statements() -> int:
        runner = b.runner()
        n = {"n": 0}
        sa.event.listen(runner.target_engine, "before_cursor_execute", lambda *a: n.__setitem__("n", n["n"] + 1))
        runner.check_ledger()
        return n["n"]

    few = statements()
    runner = b.runner()
    origin, st = runner.origins[QUEUE], runner.state
    with runner.target_engine.begin() as conn:  # 25,000 more quarantined messages, each an entry and its bit
        keys = range(1_000, 1_000 + 3 * 25_000, 3)
        insert_values(conn, st.ledger, LEDGER_COLUMNS,
                      [(origin, str(k), str(uuid.uuid4()), "job1", QUEUE, "quarantined", None, "no route", datetime(2024, 1, 1))
                       for k in keys])
        st.ranges.mark(conn, origin, [(k, "quarantined") for k in keys])
    assert entries_without_bits(b) == [] and b.cli("status") == 0  # a folded queue: nothing to refuse
    many = statements()
    assert many == few, f"check_ledger: {few} statements with 3 entries, {many} with 25,003"


# -- c98cfa0: lane_imports ---------------------------------------------------------------------------

_RUN_SPY = IMPORT_SPY + """atexit.register(lambda: print('WORKERS', sorted(m for m, t in first.items() if t.startswith('ThreadPoolExecutor')), flush=True))
from bridge.commands.main import main
sys.exit(main(['run', '-c', sys.argv[1]]))
"""


def test_qbridge_run_workers_still_import_lane_modules_first(make) -> None:
    """FAILED (latent; the race itself not forced; fixed: pgpq and the rules' modules imported first too). c98cfa0 imports LANE_MODULES before the
    scheduler's first ticks run side by side, but the lane imports more on its first batch, each
    first imported by a scheduler worker while the other job's worker runs its own first batch:
    pgpq (bridge/targets/bulk.py copy_arrow: every lane write to PostgreSQL), and with mapping rules
    bridge.targets.lane_rules and bridge.targets.when_columns (envelope_columns.lane_outcomes).
    (bridge.lifecycle.prune is first imported by a worker too: scheduler.py's prune.)"""
    b = make(queues=["MQueue1", "MQueue2"], batch_size=400,
             mapping=MAPPING + "[[skip]]\nname = 'regional'\nwhen = '\"Region\" in headers'\n")
    b.insert(b.ready(900))
    b.insert(b.ready(900, queue="MQueue2"), queue="MQueue2")
    out = run_two_jobs(b, _RUN_SPY)
    line = next(l for l in out.splitlines() if l.startswith("WORKERS"))
    lane = [m for m in ("pgpq", "bridge.targets.lane_rules", "bridge.targets.when_columns") if repr(m) in line]
    assert not lane, f"lane modules first imported by a scheduler worker: {lane} ({line})"


class _BrokenDriver:
    """ADBC's driver failing on import other than with ImportError (a build against another
    Arrow/numpy ABI: AttributeError '_ARRAY_API not found', RuntimeError ...)."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "adbc_driver_postgresql.dbapi":
            raise RuntimeError("adbc_driver_manager: built against another Arrow ABI")
        return None


def test_a_broken_adbc_driver_fails_sync_even_with_adbc_turned_off(make, monkeypatch) -> None:
    """FAILED (low; fixed: a broken optional driver is left for its user). ArrowReads treats any failure of ADBC's driver, its import included (inside
    `_connect`'s try), as "read through SQLAlchemy", and QBRIDGE_READ_AHEAD_ADBC=0 turns ADBC off.
    import_lane_modules imports the driver whatever that switch says (and for a source that is not
    PostgreSQL), catching ImportError only: any other failure escapes the read-ahead's `_start`
    and ends `sync` with a traceback (and `qbridge run` at Scheduler.start, every job with it).
    A missing driver (ImportError) is fine."""
    monkeypatch.setenv("QBRIDGE_READ_AHEAD_ADBC", "0")
    b = make(batch_size=100)
    b.insert(b.ready(500))
    monkeypatch.setattr(lane_imports, "_done", set())
    monkeypatch.delitem(sys.modules, "adbc_driver_postgresql.dbapi", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenDriver, *sys.meta_path])
    try:
        rc = b.cli("sync", "--once")
    except RuntimeError as e:
        pytest.fail(f"sync with ADBC turned off failed on the driver's import: {e!r}")
    assert rc == 0 and b.count("Orders") == 500
