"""Guarantees under failure, on PostgreSQL: late commits, locked rows, and real SIGKILLs."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge, kill_at


def _exactly_once(b: Bridge, expected: int) -> None:
    ids = b.message_ids("Orders")
    assert len(ids) == expected, f"{len(ids)} distinct messages, expected {expected}"
    assert set(ids.values()) == {1}, "a message arrived twice"


def test_lower_id_committed_after_higher_one_was_synced_is_delivered_once(make) -> None:
    b = make()
    slow = b.source.connect()
    tx = slow.begin()
    [low] = b.insert_in(slow, b.ready(1))  # id allocated, transaction still open
    later = b.insert(b.ready(3, start=2))
    assert min(later) > low
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 3
    tx.commit()
    slow.close()
    assert b.cli("sync", "--once") == 0
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 4)
    assert b.cli("verify") == 0


def test_a_gap_given_up_too_early_is_reported_by_verify(make, capsys: pytest.CaptureFixture[str]) -> None:
    b = make(window="0s")  # stop waiting for late commits at once: a misconfiguration on purpose
    slow = b.source.connect()
    tx = slow.begin()
    [low] = b.insert_in(slow, b.ready(1))
    b.insert(b.ready(2, start=2))
    assert b.cli("sync", "--once") == 0
    assert b.cli("sync", "--once") == 0  # gives the gap up
    tx.commit()
    slow.close()
    assert b.cli("sync", "--once") == 0
    capsys.readouterr()
    assert b.cli("verify", "--json") == 1
    report = json.loads(capsys.readouterr().out)
    q = report["jobs"][0]["queues"][0]
    assert q["missing"] == 1 and q["missing_keys"] == [str(low)]


def test_move_mode_skips_rows_an_nginn_receiver_holds_and_takes_them_later(make) -> None:
    b = make(mode="move")
    ids = b.insert(b.ready(4))
    t = b.tables["MQueue1"]
    receiver = b.source.connect()
    tx = receiver.begin()
    # NGinn's SelectAndLockNext: the row is locked while its handler runs.
    receiver.execute(sa.select(t.c.id).where(t.c.id == ids[1]).with_for_update())
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 3
    tx.rollback()  # the handler failed: the row is back in I
    receiver.close()
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 4)
    assert set(b.subqueues().values()) == {"X"}

    more = b.insert(b.ready(2, start=5))
    receiver = b.source.connect()
    tx = receiver.begin()
    receiver.execute(sa.select(t.c.id).where(t.c.id == more[0]).with_for_update())
    assert b.cli("sync", "--once") == 0
    receiver.execute(sa.update(t).where(t.c.id == more[0]).values(subqueue="X"))  # NGinn processed it
    tx.commit()
    receiver.close()
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 5)  # the bridge never delivers what NGinn itself processed
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_sigkill_between_target_commit_and_source_consume_in_move_mode(make, tmp_path: Path) -> None:
    b = make(mode="move", batch_size=25)
    b.insert(b.ready(60))
    kill_at(b, "after_target_commit", tmp_path)
    assert b.count("Orders") == 25  # the target committed...
    assert list(b.subqueues().values()).count("I") == 60  # ...the source did not
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 60)
    assert set(b.subqueues().values()) == {"X"}
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_sigkill_before_target_commit_loses_and_doubles_nothing(make, tmp_path: Path) -> None:
    b = make(batch_size=25)
    b.insert(b.ready(60))
    kill_at(b, "before_target_commit", tmp_path)
    assert b.count("Orders") == 0
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 60)
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_sigkill_at_a_random_moment_then_rerun(make, tmp_path: Path) -> None:
    b = make(batch_size=50)
    b.insert(b.ready(3000))
    proc = b.spawn("sync", "--once")
    deadline = time.monotonic() + 60
    while b.ledger().total() == 0:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert 0 < b.count("Orders") < 3000
    assert b.cli("sync", "--once") == 0
    _exactly_once(b, 3000)
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_two_processes_at_once_deliver_each_message_once(make) -> None:
    b = make(batch_size=20)
    b.insert(b.ready(1000))
    procs = [b.spawn("sync", "--once") for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    _exactly_once(b, 1000)
    assert b.cli("verify") == 0


def test_ids_rolled_back_are_given_up_after_the_window(make) -> None:
    b = make(window="1s")
    with b.source.connect() as conn:
        tx = conn.begin()
        b.insert_in(conn, b.ready(2))
        tx.rollback()  # identity values consumed, rows never committed
    b.insert(b.ready(2, start=3))
    assert b.cli("sync", "--once") == 0
    time.sleep(1.1)
    assert b.cli("sync", "--once") == 0
    status = b.runner()
    from bridge.lifecycle.verify import status as job_status

    assert job_status(status)["queues"][0]["open_gaps"] == 0
    assert b.cli("verify") == 0


@pytest.mark.slow
def test_two_jobs_reading_one_queue_at_once_deliver_each_message_once(make) -> None:
    b = make(batch_size=20)
    text = b.config.read_text()
    job = text[text.index("[[jobs]]"):]
    b.config.write_text(text + job.replace('name     = "job1"', 'name     = "job2"'))
    b.insert(b.ready(600))
    procs = [b.spawn("sync", "--once", "--job", name) for name in ("job1", "job2")]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    _exactly_once(b, 600)
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_a_range_delivered_before_is_caught_by_the_ledger_without_a_lookup(make) -> None:
    """Spark units insert without looking the ledger up first; a message delivered already
    collides on its key, and the batch is redone with the lookup: nothing twice, nothing lost."""
    b = make(batch_size=20)
    ids = b.insert(b.ready(50))
    first = b.runner().run_range("MQueue1", None, ids[29])
    assert (first.stats.delivered, first.stats.already) == (30, 0)
    again = b.runner().run_range("MQueue1", None, ids[-1])  # a new process: optimistic again
    assert (again.stats.delivered, again.stats.already) == (20, 30)
    assert b.count("Orders") == 50 and b.ledger()["delivered"] == 50
