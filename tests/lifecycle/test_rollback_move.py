"""`qbridge rollback` of a move-mode job (issue 28): the withdrawn messages' legacy rows are given
back to NGinn's receiver in the subqueue they had, then delivered again exactly once; a SIGKILL
between any two commits and a second run lose and double nothing; a row given back and taken
again by the legacy receiver is never given back twice; a row gone before it could be given
back is quarantined, not lost."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.demo.samples import nginn_row
from helpers import Bridge, endpoint_takes, kill_at

TABLES = ("Orders", "Orders.Delayed", "error")


def _mixed(b: Bridge, n: int) -> dict[int, str]:
    """Ready, delayed (retry ahead), failed and processed rows; returns id -> subqueue."""
    now = b.now_local()
    rows = []
    for i in range(1, n + 1):
        letter = {0: "X", 1: "R", 2: "F"}.get(i % 10, "I")
        rows.append(nginn_row("MQueue1", i, now, subqueue=letter,
                              retry_time=now + timedelta(hours=2) if letter == "R" else None))
    ids = b.insert(rows)
    return dict(zip(ids, (r["subqueue"] for r in rows)))


@pytest.fixture()
def bridge(on_each_db):
    return on_each_db(batch_size=10, mode="move")


def test_rows_come_back_in_the_subqueue_they_had_and_are_delivered_again_once(bridge: Bridge, capsys) -> None:
    b = bridge
    letters = _mixed(b, 60)
    assert b.cli("sync", "--once") == 0
    before = b.message_ids(*TABLES)
    assert set(b.subqueues().values()) == {"X"}  # move mode consumed every row it delivered
    taken_ids = endpoint_takes(b, 4)
    capsys.readouterr()
    assert b.cli("rollback", "--job", "job1", "--dry-run", "--json") == 0
    [plan] = json.loads(capsys.readouterr().out)["queues"]
    delivered = sum(before.values())
    assert (plan["withdrawn"], plan["given_back"], plan["consumed"]) == (delivered - 4, delivered - 4, 4)
    assert set(b.subqueues().values()) == {"X"} and sum(b.message_ids(*TABLES).values()) == delivered - 4
    assert b.cli("rollback", "--yes", "--job", "job1", "--json") == 0
    [w] = json.loads(capsys.readouterr().out)["queues"]
    assert (w["withdrawn"], w["given_back"], w["quarantined"]) == (delivered - 4, delivered - 4, 0)
    assert not b.message_ids(*TABLES)
    taken = set(_key_of_taken(b, before, taken_ids))
    now = b.subqueues()
    assert {k: v for k, v in now.items() if k not in taken} == {k: v for k, v in letters.items() if k not in taken}
    assert all(now[k] == "X" for k in taken)  # an endpoint has those: their rows stay consumed
    assert b.cli("verify") == 0
    assert b.cli("sync", "--once") == 0
    assert b.message_ids(*TABLES) == Counter({m: 1 for m in before if m not in taken_ids})
    assert set(b.subqueues().values()) == {"X"}
    assert b.cli("verify") == 0
    assert b.runner().state.givebacks is not None
    with b.target.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(b.runner().state.givebacks)).scalar_one() == 0


def _key_of_taken(b: Bridge, before: Counter, taken_ids: list[str]) -> list[int]:
    from bridge.model import message_ids

    ids = sorted(b.subqueues())
    mids = message_ids("nginn", "LegacyDb", "MQueue1", [str(i) for i in ids])
    return [i for i, m in zip(ids, mids) if str(m) in taken_ids]


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["rollback_before_commit:2", "rollback_after_commit:2",
                                   "giveback_before_legacy_commit:2", "giveback_after_legacy_commit:2"])
def test_killed_between_any_two_commits_nothing_is_lost_or_doubled(make, tmp_path: Path, point: str) -> None:
    b = make(batch_size=50, mode="move")
    b.insert(b.ready(2500))
    assert b.cli("sync", "--once") == 0
    before = b.message_ids(*TABLES)
    kill_at(b, point, tmp_path, ("rollback", "--yes", "--job", "job1"))
    assert b.cli("sync", "--once") == 0  # a pass first gives back what is owed, then delivers it again
    assert b.message_ids(*TABLES) == before
    assert set(b.subqueues().values()) == {"X"}
    assert b.cli("verify") == 0
    kill_at(b, point, tmp_path, ("rollback", "--yes", "--job", "job1"))
    assert b.cli("rollback", "--yes", "--job", "job1") == 0  # rollback run again finishes the job
    assert not b.message_ids(*TABLES) and not b.ledger()
    assert set(b.subqueues().values()) == {"I"}
    assert b.cli("sync", "--once") == 0
    assert b.message_ids(*TABLES) == before
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_a_row_given_back_and_taken_again_by_the_legacy_receiver_is_not_given_back_twice(make, tmp_path: Path) -> None:
    """Killed after the legacy commit, before the owed rows are struck off: NGinn's receiver
    takes one of the given-back rows meanwhile. The next run gives back nothing twice."""
    b = make(batch_size=50, mode="move")
    ids = b.insert(b.ready(1500))
    assert b.cli("sync", "--once") == 0
    kill_at(b, "giveback_after_legacy_commit:1", tmp_path, ("rollback", "--yes", "--job", "job1"))
    back = [k for k, v in b.subqueues().items() if v == "I"]
    assert len(back) == 1000  # the first batch of withdrawals
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:  # NGinn's SelectAndLockNext2, a moment later
        conn.execute(sa.update(t).where(t.c.id == back[0], t.c.subqueue == "I")
                     .values(subqueue="X", last_processed=b.now_local() + timedelta(seconds=1)))
    assert b.cli("rollback", "--yes", "--job", "job1") == 0
    now = b.subqueues()
    assert now[back[0]] == "X" and all(now[k] == "I" for k in ids if k != back[0])
    assert not b.message_ids(*TABLES)
    assert b.cli("sync", "--once") == 0
    assert len(b.message_ids("Orders")) == 1499 and all(n == 1 for n in b.message_ids("Orders").values())
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_a_row_gone_before_it_was_given_back_is_quarantined_and_replayed_once(make, tmp_path: Path, capsys) -> None:
    b = make(batch_size=50, mode="move")
    ids = b.insert(b.ready(60))
    assert b.cli("sync", "--once") == 0
    kill_at(b, "rollback_after_commit:1", tmp_path, ("rollback", "--yes", "--job", "job1"))
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:  # NGinn's CleanupProcessedMessages, in between
        conn.execute(sa.delete(t).where(t.c.id == ids[0]))
    capsys.readouterr()
    assert b.cli("rollback", "--yes", "--job", "job1", "--json") == 0
    [w] = json.loads(capsys.readouterr().out)["queues"]
    assert w["quarantined"] == 1
    assert b.ledger()["quarantined"] == 1
    assert b.cli("quarantine", "list", "--json") == 0
    [q] = json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]
    assert q["source_key"] == str(ids[0]) and "gave it back" in q["reason"]
    assert b.cli("sync", "--once") == 0
    assert sum(b.message_ids("Orders").values()) == 59
    assert b.cli("quarantine", "replay", "--job", "job1", "--id", q["message_id"]) == 0
    assert b.cli("quarantine", "replay", "--job", "job1", "--id", q["message_id"]) == 1  # not in quarantine any more
    assert b.message_ids("Orders") == Counter({m: 1 for m in b.message_ids("Orders")}) and b.count("Orders") == 60
    assert b.cli("verify") == 0


def test_print_sql_shows_the_give_back(tmp_path: Path, capsys) -> None:
    (tmp_path / "m.toml").write_text('[routes]\n"MQueue1" = "Orders"\n')
    (tmp_path / "c.toml").write_text('[connections]\nlegacy = "mssql+pyodbc://u:p@legacy-dsn"\nnsb = "mssql+pyodbc://u:p@nsb-dsn"\n'
                                     '[[jobs]]\nname = "j"\nmode = "move"\nsource = { system = "nginn", connection = "legacy", '
                                     'queues = ["MQueue1"], timezone = "UTC" }\ntarget = { connection = "nsb", flavor = "sqlserver" }\n'
                                     'mapping = "m.toml"\n')
    from bridge.commands.main import main

    assert main(["rollback", "-c", str(tmp_path / "c.toml"), "--job", "j", "--print-sql"]) == 0
    sql = capsys.readouterr().out
    assert "INSERT INTO dbo.qbridge_givebacks" in sql and "subqueue = 'X'" in sql


@pytest.mark.postgres
@pytest.mark.slow
def test_a_migration_after_a_killed_rollback_gives_back_before_it_plans(make, tmp_path: Path) -> None:
    """The withdrawal committed, the rows not yet given back: `migrate` plans its Spark units
    from the lowered checkpoint, so it must give them back first (read while owed, they would
    be taken as processed)."""
    b = make(batch_size=50, mode="move")
    b.insert(b.ready(1500))
    assert b.cli("sync", "--once") == 0
    before = b.message_ids(*TABLES)
    kill_at(b, "rollback_after_commit:1", tmp_path, ("rollback", "--yes", "--job", "job1"))
    assert sum(b.message_ids(*TABLES).values()) == 500
    assert b.cli("migrate", "--master", "local[2]") == 0
    assert b.message_ids(*TABLES) == before
    assert set(b.subqueues().values()) == {"X"}
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_a_row_gone_after_an_attempt_that_may_have_given_it_back_is_quarantined_with_a_warning(make, tmp_path: Path,
                                                                                              capsys) -> None:
    """Killed after the legacy commit: the row was given back, then NGinn may have processed it
    and cleaned it up. Gone now, its message is quarantined with a reason that says to check
    NGinn before replaying, not the plain advice to replay it."""
    b = make(batch_size=50, mode="move")
    ids = b.insert(b.ready(60))
    assert b.cli("sync", "--once") == 0
    kill_at(b, "giveback_after_legacy_commit:1", tmp_path, ("rollback", "--yes", "--job", "job1"))
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:
        conn.execute(sa.delete(t).where(t.c.id == ids[0]))
    assert b.cli("rollback", "--yes", "--job", "job1") == 0
    capsys.readouterr()
    assert b.cli("quarantine", "list", "--json") == 0
    [q] = json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]
    assert q["source_key"] == str(ids[0]) and "check NGinn's log" in q["reason"]
    assert set(b.subqueues().values()) == {"I"} and not b.message_ids(*TABLES)
