"""A second review of the exactly-once fixes of issue 25 (commit b4b7ae5): interleavings of two
passes, a pass and a quarantine replay, and crash points between the two commits of a batch.

The first three reproduce what the review found (they failed on b4b7ae5, fixed since); the others
guard the interleavings that were tried and hold, so that a later change keeps them holding.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from bridge import faults
from helpers import MAPPING, kill_at

NO_CATCH_ALL = MAPPING.replace('"*"       = "Unrouted"\n', "")


def _once(b, expected: int, table: str = "Orders") -> None:
    ids = b.message_ids(table)
    assert len(ids) == expected, f"{len(ids)} distinct messages, expected {expected}"
    assert set(ids.values()) == {1}, "a message arrived twice"


def _checkpoint(b, queue: str = "MQueue1") -> tuple:
    with b.target.connect() as conn:
        return conn.execute(sa.text(f'select pending, gaps, version from "{b.target_schema}".qbridge_checkpoint '
                                    "where queue = :q"), {"q": queue}).one()


def _bulk(b, n: int, ids: list[int] | None = None) -> None:
    """n ready NGinn rows in one statement (ids chosen, or the identity's)."""
    t = b.tables["MQueue1"]
    row = b.ready(1)[0]
    rows = [dict(row, correlation_id=f"c{i}") for i in range(n)]
    if ids is not None:
        rows = [dict(r, id=i) for r, i in zip(rows, ids)]
    with b.source.begin() as conn:
        conn.execute(t.insert(), rows)


def _subqueue_counts(b) -> dict[str, int]:
    t = b.tables["MQueue1"]
    with b.source.connect() as conn:
        return dict(conn.execute(sa.select(t.c.subqueue, sa.func.count()).group_by(t.c.subqueue)).all())


class Died(Exception):
    """A pass cut off where a test says (its connection dropped at that point)."""


# -- findings --------------------------------------------------------------------------------
@pytest.mark.postgres
def test_pending_keys_of_failed_source_commits_are_consumed_once_the_source_answers_again(make, monkeypatch) -> None:
    b = make(mode="move", batch_size=20000)
    _bulk(b, 70000)
    runner = b.runner()
    real = faults.reached
    failures = {"left": 3}

    def reached(point: str) -> None:
        if point == "after_target_commit" and failures["left"]:
            failures["left"] -= 1
            raise Died("the source connection dropped at the commit")
        real(point)

    monkeypatch.setattr(faults, "reached", reached)
    for _ in range(3):  # three batches delivered, their source commits lost: 60000 keys pending
        with pytest.raises(Died):
            runner.run_pass("MQueue1")
    assert b.count("Orders") == 60000
    # The source answers again: the next passes consume what was delivered.
    runner.run_pass("MQueue1")
    runner.run_pass("MQueue1")
    assert _subqueue_counts(b) == {"X": 70000}, "delivered rows left in I: an NGinn receiver would process them again"
    assert _checkpoint(b)[0] is None
    assert b.count("Orders") == 70000


@pytest.mark.postgres
def test_a_gap_list_longer_than_one_statement_takes_is_read_and_given_up_after_the_window(
        pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    from bridge.pipeline.spark import QueuePlan, finish_queue
    from helpers import Bridge

    # A statement timeout on the bridge's connections: an OR of thousands of ranges runs for
    # minutes on PostgreSQL (2000 gaps: ~13 s; 20000: over 18 min), and a fix that splits the
    # read into statements just under the parameter limit must fail here, not load the server.
    url = pg_server + ("&" if "?" in pg_server else "?") + "options=-c%20statement_timeout%3D120000"
    b = Bridge(tmp_path, url, url, source_schema=pg_schema, target_schema=pg_schema, batch_size=20000, window="2s")
    assert b.cli("init") == 0
    # Every other id: the holes a migration finds in a table whose inserts were often rolled back.
    n = 33000
    _bulk(b, n, ids=[2 * i for i in range(1, n + 1)])
    runner = b.runner()
    runner._prepare("MQueue1")
    unit = runner.run_range("MQueue1", None, 2 * n)  # one Spark unit's work, in-process
    assert unit.stats.delivered == n and len(unit.gaps) == n
    finish_queue(QueuePlan(runner, "MQueue1", 2 * n), unit.gaps)
    time.sleep(2.2)  # the window is over: the gaps are read one last time, and given up
    _bulk(b, 1, ids=[2 * n + 10])
    try:
        stats = runner.run_pass("MQueue1")
        assert stats.delivered == 1
        assert len(stats.gaps_given_up) == n
        _once(b, n + 1)
    finally:
        b.dispose()


@pytest.mark.postgres
def test_two_passes_consuming_the_same_pending_keys_do_not_deadlock(make, monkeypatch) -> None:
    b = make(mode="move", batch_size=3)
    b.insert(b.ready(3))
    real = faults.reached
    state = {"dead": True}
    a_committed, a_go = threading.Event(), threading.Event()

    def reached(point: str) -> None:
        name = threading.current_thread().name
        if point == "after_target_commit":
            if state["dead"]:  # the first pass dies before its source commit: its 3 keys stay pending
                state["dead"] = False
                raise Died("killed between the commits")
            if name == "pass-a":
                a_committed.set()
                assert a_go.wait(30)
        real(point)

    monkeypatch.setattr(faults, "reached", reached)
    with pytest.raises(Died):
        b.runner().run_pass("MQueue1")
    b.insert(b.ready(3, start=4))
    errors: list[BaseException] = []

    def run(runner) -> None:
        try:
            runner.run_pass("MQueue1")
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    ta = threading.Thread(target=run, args=(b.runner(),), name="pass-a")
    ta.start()
    assert a_committed.wait(30)  # A: target committed, its rows locked, not consumed yet
    b.insert(b.ready(3, start=7))
    tb = threading.Thread(target=run, args=(b.runner(),), name="pass-b")
    tb.start()
    # B delivers its rows and consumes everything pending: it waits for A's rows.
    deadline = time.monotonic() + 30
    while True:
        with b.source.connect() as conn:  # a transaction each: pg_stat_activity is read once per transaction
            if conn.execute(sa.text("select count(*) from pg_stat_activity where wait_event_type = 'Lock' "
                                    "and query ilike 'UPDATE%MQueue1%'")).scalar():
                break
        assert time.monotonic() < deadline, "pass B never waited for pass A's rows"
        time.sleep(0.05)
    a_go.set()
    ta.join(60)
    tb.join(60)
    monkeypatch.setattr(faults, "reached", real)
    b.runner().run_pass("MQueue1")
    assert set(b.subqueues().values()) == {"X"}
    _once(b, 9)
    assert not errors, [f"{type(e).__name__}: {str(getattr(e, 'orig', e)).splitlines()[0]}" for e in errors]


# -- guards: interleavings tried that hold ------------------------------------------------------
@pytest.mark.postgres
def test_a_replay_beside_a_pass_that_dies_before_its_source_commit_consumes_both(make, monkeypatch) -> None:
    """Replay adds its key to the pending list after a pass's target commit, consumes its own
    key and settles only that: neither the pass's keys nor the replayed one are left unconsumed
    when the pass then dies (the next pass consumes the pass's)."""
    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    from bridge.lifecycle.quarantine import QuarantineDesk

    b = make(queues=["MQueue3"], mode="move", mapping=NO_CATCH_ALL, batch_size=10)
    b.insert(b.ready(2, queue="MQueue3"), queue="MQueue3")
    assert b.cli("sync", "--once") == 0  # no route: both quarantined, left in I
    b.mapping = NO_CATCH_ALL.replace('"MQueue1" = "Orders"', '"MQueue1" = "Orders"\n"MQueue3" = "Orders"')
    b.write_config()
    b.insert(b.ready(3, queue="MQueue3", start=3), queue="MQueue3")
    config = load_config(b.config)
    real = faults.reached
    at_gap, go = threading.Event(), threading.Event()

    def reached(point: str) -> None:
        if threading.current_thread().name == "pass" and point == "after_target_commit":
            at_gap.set()
            assert go.wait(30)
            raise Died("the source connection dropped at the commit")
        real(point)

    monkeypatch.setattr(faults, "reached", reached)
    died: list[BaseException] = []

    def run() -> None:
        try:
            JobRunner(config, config.jobs[0]).run_pass("MQueue3")
        except Died as e:
            died.append(e)

    t = threading.Thread(target=run, name="pass")
    t.start()
    assert at_gap.wait(30)
    replayed: list = []
    r = threading.Thread(target=lambda: replayed.extend(QuarantineDesk(JobRunner(config, config.jobs[0]), "ann", None).replay(None)))
    r.start()
    time.sleep(1.0)  # the replay has committed and waits for the pass's rows
    go.set()
    t.join(30)
    r.join(30)
    assert died and [o.action for o in replayed] == ["replayed", "replayed"]
    monkeypatch.setattr(faults, "reached", real)
    # The replay consumed its own keys; the dead pass's are the next pass's to consume, under
    # the checkpoint lock (a replay that took them too could wait in a circle with a live pass).
    JobRunner(config, config.jobs[0]).run_pass("MQueue3")
    assert set(b.subqueues("MQueue3").values()) == {"X"}
    _once(b, 5)
    assert _checkpoint(b, "MQueue3")[0] is None
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_sigkill_between_the_source_commit_and_settling_doubles_nothing(make, tmp_path: Path) -> None:
    """Killed after its source commit, before settle_pending: the keys stay pending, the next
    pass consumes them again (a no-op: they are X) and clears them."""
    b = make(mode="move", batch_size=5)
    b.insert(b.ready(12))
    kill_at(b, "after_source_commit", tmp_path)
    assert orjson.loads(_checkpoint(b)[0]) and list(b.subqueues().values()).count("X") == 5
    assert b.cli("sync", "--once") == 0
    assert set(b.subqueues().values()) == {"X"}
    _once(b, 12)
    assert _checkpoint(b)[0] is None
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_copy_mode_reads_a_late_row_a_receiver_holds_when_its_gap_expires(make, caplog) -> None:
    """Copy mode reads committed rows whoever locks them: the last read of an expired gap finds
    the row a receiver holds, and the gap is gone (not kept open by keys_in)."""
    from tests.ledger.test_late_gaps_and_pending_keys import sync_while_a_receiver_holds_the_late_row

    b = make(window="1s")
    sync_while_a_receiver_holds_the_late_row(b, caplog)
    _once(b, 3)
    assert orjson.loads(_checkpoint(b)[1]) == []
    assert "never committed" not in caplog.text


@pytest.mark.postgres
@pytest.mark.mariadb
def test_reverse_passes_settle_each_others_keys_with_the_state_on_mariadb(pg_server: str, pg_schema: str,
                                                                          mariadb_database: str, tmp_path: Path,
                                                                          monkeypatch) -> None:
    """A reverse job keeps its checkpoint beside the legacy rows, here in MariaDB, whose UPDATE
    counts changed rows (no FOUND_ROWS through pyodbc). Pass A commits; pass B, which waited for
    the checkpoint row, saves A's keys with its own; A settles after B's save (its version check
    misses: the slow path), then B settles. Every proxy row is consumed once, nothing stays pending."""
    from bridge.commands.main import main as cli_main
    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    from bridge.demo.samples import create_nginn_queue
    from nsb_endpoint import Endpoint
    from tests.systems.test_reverse_nginn import mariadb_reverse_config

    config = mariadb_reverse_config(tmp_path, pg_server, pg_schema, mariadb_database, batch_size=3)
    assert cli_main(["init", "-c", str(config)]) == 0
    engine = sa.create_engine(pg_server)
    ep = Endpoint(engine, pg_schema, "Orders")
    sent = [ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send") for _ in range(6)]
    for i, h in enumerate(sent):
        ep.send(ep.address("Sender"), h, orjson.dumps({"OrderId": i}))
    cfg = load_config(config)
    real = faults.reached
    a_locked, a_committed, b_committed = threading.Event(), threading.Event(), threading.Event()

    def reached(point: str) -> None:
        name = threading.current_thread().name
        if name == "pass-a" and point == "before_target_commit":
            a_locked.set()  # A holds the checkpoint row: B finds nothing pending yet and queues behind it
            time.sleep(1.0)
        if name == "pass-a" and point == "after_target_commit":
            a_committed.set()
            assert b_committed.wait(30)  # B has saved A's keys with its own before A consumes
        if name == "pass-b" and point == "after_target_commit":
            b_committed.set()
        real(point)

    monkeypatch.setattr(faults, "reached", reached)
    errors: list[BaseException] = []

    def run(runner) -> None:
        try:
            runner.run_pass("Sender")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ta = threading.Thread(target=run, args=(JobRunner(cfg, cfg.jobs[0]),), name="pass-a")
    ta.start()
    assert a_locked.wait(30)
    tb = threading.Thread(target=run, args=(JobRunner(cfg, cfg.jobs[0]),), name="pass-b")
    tb.start()
    ta.join(60)
    tb.join(60)
    assert not errors, errors
    legacy = sa.create_engine(mariadb_database)
    try:
        table = create_nginn_queue(legacy, "Sender")
        with legacy.connect() as conn:
            unique_ids = [r for (r,) in conn.execute(sa.select(table.c.unique_id).order_by(table.c.id))]
            pending = conn.execute(sa.text("select pending from qbridge_checkpoint where job = 'to-legacy'")).scalar_one()
        with engine.connect() as conn:
            left = conn.execute(sa.text(f'select count(*) from "{pg_schema}"."Sender"')).scalar_one()
    finally:
        legacy.dispose()
        engine.dispose()
    assert sorted(unique_ids) == sorted(h["NServiceBus.MessageId"] for h in sent)
    assert left == 0 and pending is None
    assert cli_main(["verify", "-c", str(config)]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "mariadb"])
def test_openjms_handle_keys_pending_after_a_sigkill_are_consumed_once(request, tmp_path: Path, pg_server: str,
                                                                      pg_schema: str, kind: str) -> None:
    """OpenJMS handle keys ("messageId#consumerId" text) survive the checkpoint's JSON as they
    were: killed after the source commit, before settling, the next pass consumes them again (a
    no-op) and clears them, and a handle delivered but not consumed (killed before the source
    commit) is consumed by the pass after, without a second delivery."""
    from tests.systems.test_openjms_source import make_jms

    for j in make_jms(kind, request, tmp_path, pg_server, pg_schema, mode="move", batch_size=4, queues=["orders"]):
        for i in range(10):
            j.queue_message(f"ID:r-{i}#x", accepted=i)  # a '#' in the message id too
        kill_at(j, "after_source_commit", tmp_path)
        pending = orjson.loads(_checkpoint(j, "orders")[0])
        assert len(pending) == 4 and all(isinstance(k, str) for k in pending)
        assert j.count_rows("message_handles") == 6
        kill_at(j, "after_target_commit", tmp_path)
        assert j.count("Orders") == 8 and j.count_rows("message_handles") == 6
        assert j.cli("sync", "--once") == 0
        _once(j, 10)
        assert j.count_rows("message_handles") == 0 and j.count_rows("messages") == 0
        assert _checkpoint(j, "orders")[0] is None
        assert j.cli("verify") == 0
