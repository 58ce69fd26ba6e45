"""Ledger entries that can no longer matter are pruned (issue 27): a scan source's or a reverse
job's entry once its source row is gone and it is older than ledger_retention; never one whose
row is still there, a quarantined one, or an NGinn one; the totals keep counting."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.systems.test_openjms_source import Jms, make_jms
from tests.systems.test_reverse_nginn import two_way  # noqa: F401 - a fixture


def entries(b) -> int:
    with b.target.connect() as conn:
        return conn.execute(sa.text(f'select count(*) from "{b.target_schema}".qbridge_ledger')).scalar_one()


def with_retention(b, retention: str) -> None:
    text = b.config.read_text().replace('late_commit_window = "15m"', f'late_commit_window = "1s"\nledger_retention = "{retention}"')
    b.config.write_text(text)


@pytest.fixture()
def moved(request, tmp_path: Path, pg_server: str, pg_schema: str):
    """An OpenJMS queue in move mode whose 6 handles were delivered and consumed; retention 2 s."""
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, queues=["orders"], mode="move"):
        with_retention(j, "2s")
        for i in range(6):
            j.queue_message(f"ID:m-{i}")
        assert j.cli("sync", "--once") == 0
        assert j.count_rows("message_handles") == 0 and entries(j) == 6
        yield j


@pytest.mark.postgres
def test_entries_whose_rows_are_gone_go_once_older_than_the_retention(moved: Jms, capsys) -> None:
    j = moved
    capsys.readouterr()
    assert j.cli("ledger", "prune", "--json") == 0  # too young
    assert json.loads(capsys.readouterr().out)["queues"][0]["removed"] == 0 and entries(j) == 6
    time.sleep(2.1)
    assert j.cli("ledger", "prune", "--dry-run", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dry_run"] and report["queues"][0] == {"job": "job1", "queue": "orders", "looked_at": 6, "removed": 6,
                                                         "still_in_source": 0}
    assert entries(j) == 6
    assert j.cli("ledger", "prune") == 0
    assert "removed" in capsys.readouterr().out
    assert entries(j) == 0
    assert j.cli("status", "--json") == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["rows_moved"] == 6  # the totals keep counting
    assert j.cli("verify", "--json") == 0
    q = json.loads(capsys.readouterr().out)["jobs"][0]["queues"][0]
    assert q["pruned"] == 6 and q["missing"] == 0


@pytest.mark.postgres
def test_an_entry_whose_row_is_still_there_stays_whatever_its_age(request, tmp_path: Path, pg_server: str, pg_schema: str,
                                                                   capsys) -> None:
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, queues=["orders"]):  # copy mode
        with_retention(j, "1s")
        for i in range(3):
            j.queue_message(f"ID:c-{i}")
        assert j.cli("sync", "--once") == 0
        time.sleep(1.1)
        capsys.readouterr()
        assert j.cli("ledger", "prune", "--json") == 0
        assert json.loads(capsys.readouterr().out)["queues"][0]["still_in_source"] == 3
        assert entries(j) == 3
        assert j.cli("sync", "--once") == 0  # and nothing is delivered twice
        assert j.count("Orders") == 3


@pytest.mark.postgres
def test_quarantined_and_nginn_entries_are_never_pruned(make, capsys) -> None:
    from bridge.demo.samples import nginn_row

    b = make(mode="move")
    with_retention(b, "1s")
    now = b.now_local()
    b.insert([nginn_row("MQueue1", 1, now), nginn_row("MQueue1", 2, now, headers="Filter=a=b")])
    assert b.cli("sync", "--once") == 0
    time.sleep(1.1)
    assert b.cli("ledger", "prune") == 0
    assert entries(b) == 1  # the quarantined one: NGinn's delivered key is a range bit
    assert b.ledger() == {"delivered": 1, "quarantined": 1}


@pytest.mark.postgres
def test_qbridge_run_prunes_on_its_own_schedule(moved: Jms) -> None:
    from bridge.service.scheduler import JobWorker

    time.sleep(2.1)
    worker = JobWorker(moved.runner(), threading.Event())
    try:
        worker.tick()
        assert entries(moved) == 0
        assert worker.prune_at > worker.clock() + 5  # the next round is a while away (10 s at least)
    finally:
        worker.lock.release()


@pytest.mark.postgres
def test_a_round_that_hit_its_limit_is_followed_by_another_after_the_next_drain(moved: Jms, monkeypatch) -> None:
    """A bounded round per tick, but as many rounds as the inflow needs: pruning keeps up."""
    from bridge.service import scheduler
    monkeypatch.setattr(scheduler, "PRUNE_LIMIT", 4)
    time.sleep(2.1)
    worker = scheduler.JobWorker(moved.runner(), threading.Event())
    try:
        worker.tick()
        assert entries(moved) == 2 and worker.prune_at <= worker.clock()
        worker.tick()
        assert entries(moved) == 0 and worker.prune_at > worker.clock() + 5
    finally:
        worker.lock.release()


def test_a_retention_shorter_than_the_late_commit_window_is_a_config_error(tmp_path: Path, capsys) -> None:
    from helpers import Bridge

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    b.config.write_text(b.config.read_text().replace('late_commit_window = "15m"', 'late_commit_window = "15m"\nledger_retention = "10m"'))
    assert b.cli("status") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ledger_retention '10m' is shorter than late_commit_window '15m'" in err


@pytest.mark.postgres
def test_a_reverse_jobs_entries_go_once_their_messages_left_the_proxy_queue(two_way, capsys) -> None:
    from nsb_endpoint import Endpoint

    tw = two_way()
    tw.write_config(schedule='late_commit_window = "1s"\nledger_retention = "2s"')
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    for i in range(3):
        ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), b'{"a":1}')
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    time.sleep(2.1)
    capsys.readouterr()
    assert tw.cli("ledger", "prune", "--job", "to-legacy", "--json") == 0
    assert json.loads(capsys.readouterr().out)["queues"][0]["removed"] == 3
    assert tw.cli("verify", "--job", "to-legacy", "--json") == 0
    q = json.loads(capsys.readouterr().out)["jobs"][0]["queues"][0]
    assert (q["delivered"], q["pruned"], q["backlog"]) == (3, 3, 0)


@pytest.mark.postgres
def test_init_adds_the_age_index_to_a_ledger_made_without_it(make, capsys) -> None:
    b = make()
    with b.target.begin() as conn:
        conn.execute(sa.text(f'drop index "{b.target_schema}".ix_qbridge_ledger_origin_at'))
    capsys.readouterr()
    assert b.cli("init") == 0
    assert "qbridge_ledger (index ix_qbridge_ledger_origin_at added)" in " ".join(capsys.readouterr().out.split())
    with b.target.connect() as conn:
        names = {i["name"] for i in sa.inspect(conn).get_indexes("qbridge_ledger", schema=b.target_schema)}
    assert "ix_qbridge_ledger_origin_at" in names


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_a_biztalk_instance_suspended_past_the_retention_then_resumed_is_not_delivered_again(
        request, tmp_path: Path, kind: str, capsys) -> None:
    """Issue 35, finding 2: an entry delivered from `<Host>Q`; BizTalk suspends its instance (the
    entry moves to `<Host>Q_Suspended`, whose copy goes to `error`); the prune runs past the
    retention; an operator resumes the instance (the entry is back in `<Host>Q` with the same
    message and instance ids). It is not delivered again: its entry stayed, as its message
    lived on in the Spool. Once the instance completed and the MessageBox purged the message, the
    entry goes."""
    from datetime import datetime

    from tests.systems.test_biztalk_source import SMALL, fx, make_bt

    for bt in make_bt(kind, request, tmp_path):
        with_retention(bt, "2s")
        message, instance = bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        assert bt.cli("sync", "--once") == 0
        assert bt.count("Orders") == 1
        work, suspended, info = bt.bt["BizTalkServerApplicationQ"], bt.bt["BizTalkServerApplicationQ_Suspended"], bt.bt["InstancesSuspended"]
        with bt.source.begin() as conn:  # BizTalk suspends the instance
            conn.execute(sa.delete(work).where(work.c.uidMessageID == message))
            conn.execute(sa.insert(suspended).values(uidMessageID=message, uidInstanceID=instance, nvcAdditionalInfo="x"))
            conn.execute(sa.insert(info).values(uidInstanceID=instance, nState=4, dtSuspendTimeStamp=datetime(2024, 3, 14, 9, 27),
                                                nvcAdapter="FILE", nvcURI="in", nvcErrorDescription="failed"))
        assert bt.cli("sync", "--once") == 0
        assert bt.count("error") == 1
        time.sleep(2.5)
        capsys.readouterr()
        assert bt.cli("ledger", "prune", "--json") == 0
        [q] = json.loads(capsys.readouterr().out.splitlines()[-1])["queues"]
        assert (q["looked_at"], q["removed"], q["still_in_source"]) == (2, 0, 2)
        with bt.source.begin() as conn:  # an operator resumes it
            conn.execute(sa.delete(suspended).where(suspended.c.uidMessageID == message))
            conn.execute(sa.delete(info).where(info.c.uidInstanceID == instance))
            conn.execute(sa.insert(work).values(uidMessageID=message, uidInstanceID=instance))
        assert bt.cli("sync", "--once") == 0
        assert bt.count("Orders") == 1, "the resumed entry was delivered a second time"
        with bt.source.begin() as conn:  # the instance completes; the MessageBox purges the message
            conn.execute(sa.delete(work).where(work.c.uidMessageID == message))
            for name in ("MessageParts", "Spool"):
                conn.execute(sa.delete(bt.bt[name]).where(bt.bt[name].c.uidMessageID == message))
        assert bt.cli("ledger", "prune", "--json") == 0
        [q] = json.loads(capsys.readouterr().out.splitlines()[-1])["queues"]
        assert (q["removed"], q["still_in_source"]) == (2, 0)
        assert bt.cli("verify") == 0
