"""The three holes a review found in exactly once (issue 25), each reproduced from outside:
a late commit given up unread after an outage or a long migration, pending keys of a pass
overwritten by the pass that waited behind it, and one message twice in a reverse batch."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from bridge import faults
from bridge.pipeline.loop import JobRunner
from helpers import Bridge
from nsb_endpoint import Endpoint
from tests.systems.test_reverse_nginn import TwoWay, two_way  # noqa: F401 - two_way is a fixture


def _once(b: Bridge, expected: int) -> None:
    ids = b.message_ids("Orders")
    assert len(ids) == expected, f"{len(ids)} distinct messages, expected {expected}"
    assert set(ids.values()) == {1}, "a message arrived twice"


def _late_row(b: Bridge) -> tuple[sa.Connection, sa.RootTransaction, int]:
    """Ids 1 and 3 committed, id 2 allocated in a transaction still open."""
    [first] = b.insert(b.ready(1))
    slow = b.source.connect()
    tx = slow.begin()
    [late] = b.insert_in(slow, b.ready(1, start=2))
    [third] = b.insert(b.ready(1, start=3))
    assert first < late < third
    return slow, tx, late


# -- 1. a gap is read on the pass that gives it up -------------------------------------------
@pytest.mark.postgres
def test_a_late_commit_is_read_after_an_outage_longer_than_the_window(make, caplog) -> None:
    b = make(window="2s")
    slow, tx, late = _late_row(b)
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 2
    time.sleep(0.3)
    tx.commit()  # inside the window...
    slow.close()
    time.sleep(2.2)  # ...but no pass runs until the window is over (the target was down, say)
    caplog.set_level(logging.INFO, "qbridge.batch")
    assert b.cli("sync", "--once") == 0
    _once(b, 3)
    assert "never committed" not in caplog.text
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_a_gap_still_empty_when_the_window_ends_is_given_up_after_a_last_read(make, caplog) -> None:
    b = make(window="1s")
    slow, tx, late = _late_row(b)
    assert b.cli("sync", "--once") == 0
    time.sleep(1.1)
    caplog.set_level(logging.INFO, "qbridge.batch")
    assert b.cli("sync", "--once") == 0  # id 2 is still uncommitted: given up, and said so
    assert f"ids {late}..{late} never committed" in caplog.text
    tx.rollback()
    slow.close()
    assert b.cli("verify") == 0


def sync_while_a_receiver_holds_the_late_row(b: Bridge, caplog) -> None:
    """Id 2 commits late, a legacy receiver locks it, the window (1 s) ends, a pass runs; then the
    receiver lets go (its handler failed). No gap may be given up on the way."""
    slow, tx, late = _late_row(b)
    assert b.cli("sync", "--once") == 0
    tx.commit()
    slow.close()
    t = b.tables["MQueue1"]
    receiver = b.source.connect()
    try:
        held = receiver.begin()
        receiver.execute(sa.select(t.c.id).where(t.c.id == late).with_for_update())
        time.sleep(1.1)
        caplog.set_level(logging.INFO, "qbridge.batch")
        assert b.cli("sync", "--once") == 0
        assert "never committed" not in caplog.text
        held.rollback()
    finally:
        receiver.close()


@pytest.mark.postgres
def test_a_committed_row_a_receiver_holds_keeps_its_gap_open(make, caplog) -> None:
    """Move mode reads skip-locked: a row NGinn's receiver holds when its gap's window ends is
    there, not missing; the gap stays open and the row is taken once the receiver lets go."""
    b = make(mode="move", window="1s")
    sync_while_a_receiver_holds_the_late_row(b, caplog)
    assert b.cli("sync", "--once") == 0
    assert set(b.subqueues().values()) == {"X"}
    _once(b, 3)
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_a_late_commit_is_read_at_the_end_of_a_migration_longer_than_the_window(make, tmp_path: Path) -> None:
    """Units stamp the gaps they find when they read them; the closing pass of a migration that
    ran longer than the window reads those gaps once more before giving any up."""
    from tests.pipeline.test_spark_migrate import _java

    _java()
    b = make(window="3s", batch_size=2)
    slow, tx, late = _late_row(b)
    b.insert(b.ready(3, start=4))  # ids 4..6: the unit's second and third batches
    marker = tmp_path / "paused"
    # The unit's second batch pauses 5 s before its commit: the gap at id 2 (found by the first
    # batch) is then older than the window when the closing pass looks at it.
    proc = b.spawn("migrate", "--master", "local[1]", "--unit-rows", "100",
                   env={"QBRIDGE_FAULT_PAUSE": "before_target_commit:2", "QBRIDGE_FAULT_PAUSE_SECONDS": "5",
                        "QBRIDGE_FAULT_FILE": str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the unit never reached its second batch"
        time.sleep(0.05)
    tx.commit()  # id 2 commits while the migration runs
    slow.close()
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()
    assert b"never committed" not in err, err.decode()
    _once(b, 6)
    assert b.cli("verify") == 0


# -- 2. pending keys are merged, and consumed under the checkpoint lock -----------------------
@pytest.mark.postgres
def test_a_pass_that_waited_for_the_checkpoint_keeps_the_pending_keys_of_the_one_before(make, monkeypatch) -> None:
    """Pass A commits its target with its keys pending and dies before its source commit; pass
    B, which found nothing pending before it queued on the checkpoint row, must not write its
    own list over A's: A's rows are consumed (I -> X) by B or by the next pass."""
    b = make(mode="move", batch_size=10)
    b.insert(b.ready(5))
    a_runner, b_runner = b.runner(), b.runner()
    a_at_commit, b_started = threading.Event(), threading.Event()
    real = faults.reached

    class Died(Exception):
        pass

    def reached(point: str) -> None:
        if threading.current_thread().name == "pass-a":
            if point == "before_target_commit":
                a_at_commit.set()  # A holds the checkpoint row
                assert b_started.wait(10)
                time.sleep(1.0)  # B has read the checkpoint unlocked and queues on the row lock
            elif point == "after_target_commit":
                raise Died("connection cut at the source commit")
        real(point)

    monkeypatch.setattr(faults, "reached", reached)
    errors: list[BaseException] = []

    def pass_a() -> None:
        try:
            a_runner.run_pass("MQueue1")
        except Died:
            pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def pass_b() -> None:
        try:
            b_runner.run_pass("MQueue1")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ta = threading.Thread(target=pass_a, name="pass-a")
    ta.start()
    assert a_at_commit.wait(30)
    tb = threading.Thread(target=pass_b, name="pass-b")
    tb.start()
    b_started.set()
    ta.join(60)
    tb.join(60)
    assert not errors, errors
    assert b.count("Orders") == 5
    b.runner().run_pass("MQueue1")  # the next pass
    assert set(b.subqueues().values()) == {"X"}, "delivered rows left in I: an NGinn receiver would process them again"
    _once(b, 5)
    with b.target.connect() as conn:
        pending = conn.execute(sa.text(f'select pending from "{b.target_schema}".qbridge_checkpoint')).scalar_one()
    assert pending is None
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_pending_keys_are_cleared_only_once_consumed(make, monkeypatch) -> None:
    """A pass whose source commit fails leaves its keys pending; a later pass that consumes
    only its own rows must not clear them."""
    b = make(mode="move", batch_size=3)
    b.insert(b.ready(3))
    runner = b.runner()
    real = faults.reached
    calls = {"n": 0}

    def reached(point: str) -> None:
        if point == "after_target_commit":
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("connection cut at the source commit")
        real(point)

    monkeypatch.setattr(faults, "reached", reached)
    with pytest.raises(RuntimeError):
        runner.run_pass("MQueue1")
    assert list(b.subqueues().values()) == ["I"] * 3
    b.insert(b.ready(2, start=4))
    runner.run_pass("MQueue1")
    assert set(b.subqueues().values()) == {"X"}
    _once(b, 5)
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_sync_waits_for_the_job_lock_a_run_holds_and_names_the_holder(make, capsys) -> None:
    from bridge.ledger.joblock import JobLock

    b = make()
    b.insert(b.ready(3))
    lock = JobLock(sa.create_engine(b.target_url), "job1", schema=b.target_schema)
    assert lock.ensure()
    try:
        capsys.readouterr()
        started = time.monotonic()
        assert b.cli("sync", "--once", "--lock-wait", "1") == 1
        assert time.monotonic() - started >= 1
        err = capsys.readouterr().err
        assert "job1" in err and "held by" in err and "backend pid" in " ".join(err.split()), err
        assert b.count("Orders") == 0
    finally:
        lock.release()
    assert b.cli("sync", "--once") == 0
    _once(b, 3)


@pytest.mark.postgres
def test_run_stops_a_drain_when_its_lock_connection_is_cut(make, caplog) -> None:
    """`run` checks it still holds the job's lock before each batch: a holder whose lock
    connection was cut (so that a standby may have taken the job) stops and stands by."""
    from bridge.service.scheduler import JobWorker

    b = make(batch_size=10)
    b.insert(b.ready(50))
    runner = b.runner()
    worker = JobWorker(runner, threading.Event())
    cut = {"done": False}

    def on_batch(stats) -> None:
        if not cut["done"]:
            cut["done"] = True
            with b.target.connect() as conn:
                pid = worker.lock._conn.exec_driver_sql("select pg_backend_pid()").scalar()
                conn.execute(sa.text("select pg_terminate_backend(:p)"), {"p": pid})

    runner.on_batch = on_batch
    caplog.set_level(logging.INFO, "qbridge")
    worker.tick()
    assert b.count("Orders") == 10, "batches ran after the job's lock was lost"
    assert "lost" in caplog.text and "lock" in caplog.text
    assert not worker.lock.held
    worker.tick()  # the lock is free again: it is taken, and the rest delivered
    _once(b, 50)
    worker.lock.release()


# -- 3. one message twice in a reverse batch ---------------------------------------------------
@pytest.fixture()
def reverse(two_way) -> TwoWay:
    return two_way()


@pytest.mark.postgres
def test_a_message_sent_twice_in_one_batch_arrives_once_and_the_queue_moves_on(reverse: TwoWay) -> None:
    tw = reverse
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    twice = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    ep.send(ep.address("Sender"), twice, b'{"OrderId":1}')
    ep.send(ep.address("Sender"), twice, b'{"OrderId":1}')  # an outbox re-dispatch after a crash
    behind = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    ep.send(ep.address("Sender"), behind, b'{"OrderId":2}')
    assert tw.cli("sync", "--once", "--job", "to-legacy", "--retries", "1") == 0
    assert tw.nsb_count("Sender") == 0  # both copies taken off the proxy queue
    ids = [r["unique_id"] for r in tw.rows(tw.sender)]
    assert sorted(ids) == sorted([twice["NServiceBus.MessageId"], behind["NServiceBus.MessageId"]])
    assert tw.cli("verify", "--job", "to-legacy") == 0


@pytest.mark.postgres
def test_a_message_id_longer_than_the_ledger_key_does_not_stop_the_queue(reverse: TwoWay) -> None:
    tw = reverse
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    long_id = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    long_id["NServiceBus.MessageId"] = "order-" + "x" * 400
    ep.send(ep.address("Sender"), long_id, b'{"OrderId":1}')
    ep.send(ep.address("Sender"), long_id, b'{"OrderId":1}')
    behind = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    ep.send(ep.address("Sender"), behind, b'{"OrderId":2}')
    assert tw.cli("sync", "--once", "--job", "to-legacy", "--retries", "1") == 0
    assert tw.nsb_count("Sender") == 0
    ids = [r["unique_id"] for r in tw.rows(tw.sender)]
    assert len(ids) == 2 and behind["NServiceBus.MessageId"] in ids  # NGinn's unique_id takes 40: qbridge's id then
    assert tw.cli("verify", "--job", "to-legacy") == 0
    # The copy sent again later is still recognised.
    ep.send(ep.address("Sender"), long_id, b'{"OrderId":1}')
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    assert len(tw.rows(tw.sender)) == 2


@pytest.mark.postgres
def test_a_due_delayed_message_is_read_in_turn_with_a_full_main_queue(reverse: TwoWay) -> None:
    tw = reverse
    tw.write_config(batch_size=4)
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    for i in range(12):
        ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"),
                orjson.dumps({"OrderId": i}))
    delayed = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
    with tw.engine.begin() as conn:
        conn.execute(sa.text(f'insert into "{tw.nsb_schema}"."Sender.Delayed" (headers, body, due) '
                             "values (:h, :b, now() - interval '1 minute')"),
                     {"h": orjson.dumps(delayed).decode(), "b": b'{"OrderId":99}'})
    runner = JobRunner(*_config_job(tw, "to-legacy"))
    first = runner.run_pass("Sender")
    assert first.read == 5 and first.more  # four from the queue, one due delayed message in turn
    ids = {r["unique_id"] for r in tw.rows(tw.sender)}
    assert delayed["NServiceBus.MessageId"] in ids, "a due delayed message waited behind a full queue"


def _config_job(tw: TwoWay, name: str):
    from bridge.config import load_config

    config = load_config(tw.config)
    return config, config.job(name)


# -- also: duplicate keys told by error codes, optimism per task attempt -----------------------
def _duplicate_error(url: str, key: str, schema: str | None = None) -> tuple[sa.exc.IntegrityError, sa.exc.IntegrityError]:
    """(a duplicate key, a NOT NULL violation) raised by the real database for key `key`."""
    from bridge.db import engine_for

    engine = engine_for(url)
    t = sa.Table("dup_probe", sa.MetaData(), sa.Column("k", sa.String(50), primary_key=True),
                 sa.Column("v", sa.String(50), nullable=False), schema=schema)
    t.create(engine)
    try:
        with engine.begin() as conn:
            conn.execute(t.insert().values(k=key, v="a"))
        errors = []
        for values in ({"k": key, "v": "b"}, {"k": key + "-2", "v": None}):
            with pytest.raises(sa.exc.IntegrityError) as caught, engine.begin() as conn:
                conn.execute(t.insert().values(**values))
            errors.append(caught.value)
        return errors[0], errors[1]
    finally:
        t.drop(engine)


@pytest.mark.parametrize("key", ["checkout-17", "null-and-check", "plain"])
def test_a_duplicate_key_is_told_by_its_error_code_not_its_text_postgres(pg_server: str, pg_schema: str, key: str) -> None:
    from bridge.db import unique_violation

    dup, null = _duplicate_error(pg_server, key, pg_schema)
    assert unique_violation(dup)
    assert not unique_violation(null)


@pytest.mark.mariadb
@pytest.mark.parametrize("key", ["checkout-17", "null-and-check"])
def test_a_duplicate_key_is_told_by_its_error_code_not_its_text_mariadb(mariadb_database: str, key: str) -> None:
    from bridge.db import unique_violation

    dup, null = _duplicate_error(mariadb_database, key)
    assert unique_violation(dup)
    assert not unique_violation(null)


@pytest.mark.parametrize("key", ["checkout-17", "null-and-check"])
def test_a_duplicate_key_is_told_by_its_error_code_not_its_text_sqlite(tmp_path: Path, key: str) -> None:
    from bridge.db import unique_violation

    dup, null = _duplicate_error(f"sqlite:///{tmp_path / 'dup.db'}", key)
    assert unique_violation(dup)
    assert not unique_violation(null)


@pytest.mark.postgres
def test_a_retried_task_attempt_looks_the_ledger_up_on_a_reused_worker(make, monkeypatch) -> None:
    """Python workers are reused between tasks: a first attempt's optimism (insert without a
    lookup) must not carry over to a retried attempt of another unit on the same worker."""
    b = make(batch_size=10)
    ids = b.insert(b.ready(30))
    runner = b.runner()  # one runner per worker, as spark.run_unit caches it
    events: list[str] = []
    real_known, real_write = runner.state.known, runner.target.write

    def known(*args, **kwargs):
        # A first attempt reads the per-message entries alone (units._entries_known), no bits.
        events.append("lookup" if kwargs.get("ranged") else "entries")
        return real_known(*args, **kwargs)

    def write(*args, **kwargs):
        events.append("insert")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(runner.state, "known", known)
    monkeypatch.setattr(runner.target, "write", write)
    monkeypatch.setattr(faults, "attempt", 0)
    runner.run_range("MQueue1", None, ids[9])  # a first attempt: optimistic, no lookup of the bits
    assert "lookup" not in events and "entries" in events
    runner.run_range("MQueue1", ids[9], ids[19])  # the first attempt of a unit that dies after its commit
    monkeypatch.setattr(faults, "attempt", 1)
    events.clear()
    again = runner.run_range("MQueue1", ids[9], ids[-1])  # its retry, on the same worker
    assert events[0] == "lookup", f"a retried attempt inserted before looking the ledger's bits up: {events}"
    assert (again.stats.delivered, again.stats.already) == (10, 10)
    _once(b, 30)
