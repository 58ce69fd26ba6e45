"""`qbridge rollback` (issue 28): what a forward job delivered and no endpoint took is withdrawn
and forgotten, then delivered again exactly once; consumed messages are counted and kept; a
SIGKILL at any point and a second run lose and double nothing; a running job's lock refuses it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.demo.samples import nginn_row
from helpers import Bridge, endpoint_takes, kill_at


@pytest.fixture()
def bridge(on_each_db):
    return on_each_db(batch_size=10)


def _mixed(b: Bridge, n: int) -> None:
    now = b.now_local()
    b.insert([nginn_row("MQueue1", i, now, subqueue={0: "X", 1: "R", 2: "F"}.get(i % 10, "I")) for i in range(1, n + 1)])


def _all_ids(b: Bridge) -> Counter:
    return b.message_ids("Orders", "Orders.Delayed", "error")


def test_withdrawn_messages_are_delivered_again_once_and_consumed_ones_stay(bridge: Bridge, capsys) -> None:
    b = bridge
    _mixed(b, 60)
    assert b.cli("sync", "--once") == 0
    before = _all_ids(b)
    delivered = sum(before.values())
    consumed = endpoint_takes(b, 7)
    capsys.readouterr()
    assert b.cli("rollback", "--job", "job1", "--dry-run", "--json") == 0
    [plan] = json.loads(capsys.readouterr().out)["queues"]
    assert plan["withdrawn"] == delivered - 7 and plan["consumed"] == 7 and sorted(plan["consumed_ids"]) == sorted(consumed)
    assert sum(_all_ids(b).values()) == delivered - 7  # the dry run changed nothing
    assert b.cli("rollback", "--yes", "--job", "job1") == 0
    assert "consumed, cannot be withdrawn" in capsys.readouterr().out
    assert not _all_ids(b)
    assert b.ledger()["delivered"] == 7
    assert b.cli("verify") == 0  # the withdrawn rows are backlog again
    capsys.readouterr()
    assert b.cli("status", "--json") == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["rows_moved"] == 7
    assert b.cli("sync", "--once") == 0
    again = _all_ids(b)
    assert again == Counter({mid: 1 for mid in before if mid not in consumed})
    assert b.ledger()["delivered"] == delivered
    assert b.cli("verify") == 0
    assert b.cli("rollback", "--yes", "--job", "job1", "--queue", "MQueue1") == 0  # a second rollback, then once more again
    assert b.cli("sync", "--once") == 0 and _all_ids(b) == again


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["rollback_before_commit:2", "rollback_after_commit:2"])
def test_a_rollback_killed_at_any_point_and_run_again_loses_and_doubles_nothing(make, tmp_path: Path, point: str) -> None:
    b = make(batch_size=50)
    b.insert(b.ready(2500))
    assert b.cli("sync", "--once") == 0
    before = _all_ids(b)
    kill_at(b, point, tmp_path, ("rollback", "--yes", "--job", "job1"))
    left = _all_ids(b)
    assert 0 < sum(left.values()) < 2500 and all(n == 1 for n in left.values())
    assert b.ledger()["delivered"] == sum(left.values())  # a batch went whole or not at all
    assert b.cli("sync", "--once") == 0  # a pass between the two runs
    assert _all_ids(b) == before
    assert b.cli("rollback", "--yes", "--job", "job1") == 0
    assert not _all_ids(b) and not b.ledger()
    assert b.cli("sync", "--once") == 0
    assert _all_ids(b) == before
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_an_openjms_copy_job_is_rolled_back_and_redelivered(request, tmp_path: Path, pg_server: str, pg_schema: str) -> None:
    from tests.systems.test_openjms_source import make_jms

    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, queues=["orders"]):
        for i in range(5):
            j.queue_message(f"ID:r-{i}")
        assert j.cli("sync", "--once") == 0
        before = j.message_ids("Orders")
        assert sum(before.values()) == 5
        assert j.cli("rollback", "--yes", "--job", "job1") == 0
        assert j.count("Orders") == 0
        assert j.cli("sync", "--once") == 0
        assert j.message_ids("Orders") == before
        assert j.cli("verify") == 0


@pytest.mark.postgres
def test_refused_while_qbridge_run_holds_the_job(make, capsys) -> None:
    from bridge.ledger.joblock import JobLock

    b = make()
    _mixed(b, 5)
    assert b.cli("sync", "--once") == 0
    runner = b.runner()
    lock = JobLock(runner.target_engine, "job1", "qbridge run on testhost", runner.state.checkpoint.schema)
    assert lock.ensure()
    try:
        capsys.readouterr()
        assert b.cli("rollback", "--yes", "--job", "job1") == 1
        assert "is held by" in capsys.readouterr().err
    finally:
        lock.release()
    assert b.cli("rollback") == 2
    assert "give --job NAME" in capsys.readouterr().err
    assert b.count("Orders") > 0


def test_print_sql_compiles_for_sql_server(tmp_path: Path, capsys) -> None:
    (tmp_path / "m.toml").write_text('[routes]\n"MQueue1" = "Orders"\n')
    (tmp_path / "c.toml").write_text('[connections]\nlegacy = "mssql+pyodbc://u:p@legacy-dsn"\nnsb = "mssql+pyodbc://u:p@nsb-dsn"\n'
                                     '[[jobs]]\nname = "j"\nsource = { system = "nginn", connection = "legacy", queues = ["MQueue1"], '
                                     'timezone = "UTC" }\ntarget = { connection = "nsb", flavor = "sqlserver" }\nmapping = "m.toml"\n')
    from bridge.commands.main import main

    assert main(["rollback", "-c", str(tmp_path / "c.toml"), "--job", "j", "--print-sql"]) == 0
    sql = capsys.readouterr().out
    assert "FROM dbo.[Orders] WITH (UPDLOCK, ROWLOCK)" in sql and "DELETE FROM dbo.[Orders] WHERE" in sql
    assert "UPDATE dbo.qbridge_ledger_ranges SET" in sql


@pytest.mark.postgres
def test_a_message_whose_legacy_row_was_consumed_since_stays_delivered(make, capsys) -> None:
    """Copy mode leaves the legacy rows, but NGinn's own receiver (or this job, when it ran in
    move mode before) may have processed one since: withdrawn, it could only come back as
    skipped. It is kept, and counted."""
    b = make()
    ids = b.insert(b.ready(10))
    assert b.cli("sync", "--once") == 0
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:
        conn.execute(sa.update(t).where(t.c.id.in_(ids[:3])).values(subqueue="X"))
    capsys.readouterr()
    assert b.cli("rollback", "--yes", "--job", "job1", "--json") == 0
    [w] = json.loads(capsys.readouterr().out)["queues"]
    assert (w["withdrawn"], w["kept"]) == (7, 3)
    assert b.count("Orders") == 3 and b.ledger() == {"delivered": 3}
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 10 and len(b.message_ids("Orders")) == 10
    assert b.cli("verify") == 0
