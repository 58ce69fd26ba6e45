"""`qbridge rollback` of a move-mode BizTalk job (issue 28): move mode deleted the work-queue and
suspended-queue entries only, so each withdrawn message gets its entry back (the service it was
routed to, its additional info) while the MessageBox still holds the message; a SIGKILL between
any two commits and a rerun lose and double nothing; a message BizTalk purged before the
give-back is quarantined as it was and `quarantine replay` delivers it once."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.ledger.giveback_marks import MARKS
from helpers import kill_at
from tests.systems.test_biztalk_source import SMALL, BizTalk, fx, make_bt

HOST = "BizTalkServerApplication"
TABLES = ("Orders", "error")
SUSPENDED = {"nState": 4, "dtSuspendTimeStamp": datetime(2024, 3, 14, 9, 27, 2), "nvcAdapter": "FILE",
             "nvcURI": "D:\\In\\*.xml", "nvcErrorDescription": "receive pipeline failed", "info": "routing failure"}


def _fill(b: BizTalk, n: int = 5) -> dict[tuple[str, uuid.UUID, uuid.UUID], tuple]:
    """n ready entries, each for a service of its own, and one suspended; returns (queue, message,
    instance) -> (service, additional info)."""
    entries = {}
    for _ in range(n):
        message, instance = b.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        service = uuid.uuid4()
        with b.source.begin() as conn:
            q = b.bt[f"{HOST}Q"]
            conn.execute(sa.update(q).where(q.c.uidInstanceID == instance).values(uidServiceID=service, nvcAdditionalInfo="x"))
        entries[("Q", message, instance)] = (service, "x")
    message, instance = b.publish(context=fx("ctx_suspended.bin"), parts=[SMALL], suspended=SUSPENDED)
    entries[("S", message, instance)] = (None, "routing failure")
    return entries


def _entries(b: BizTalk) -> dict[tuple[str, uuid.UUID, uuid.UUID], tuple]:
    out = {}
    with b.source.connect() as conn:
        for kind, name in (("Q", f"{HOST}Q"), ("S", f"{HOST}Q_Suspended")):
            q = b.bt[name]
            for m, i, s, info in conn.execute(sa.select(q.c.uidMessageID, q.c.uidInstanceID, q.c.uidServiceID, q.c.nvcAdditionalInfo)):
                out[(kind, m, i)] = (s, info)
    return out


@pytest.fixture(params=["sqlite", "postgres"])
def bt(request: pytest.FixtureRequest, tmp_path: Path):
    yield from make_bt(request.param, request, tmp_path, mode="move", batch_size=2)


def test_entries_come_back_as_they_were_and_are_delivered_again_once(bt: BizTalk, capsys) -> None:
    b = bt
    entries = _fill(b)
    assert b.cli("sync", "--once") == 0
    before = b.message_ids(*TABLES)
    assert sum(before.values()) == len(entries) and not _entries(b)
    capsys.readouterr()
    assert b.cli("rollback", "--job", "job1", "--dry-run", "--json") == 0
    [plan] = json.loads(capsys.readouterr().out)["queues"]
    assert plan["given_back"] == len(entries) and not _entries(b)
    assert b.cli("rollback", "--yes", "--job", "job1", "--json") == 0
    [w] = json.loads(capsys.readouterr().out)["queues"]
    assert (w["withdrawn"], w["given_back"], w["quarantined"]) == (len(entries), len(entries), 0)
    assert not b.message_ids(*TABLES)
    assert _entries(b) == entries  # each with its service and additional info
    with b.source.connect() as conn:
        prefix = f'"{b.source_schema}".' if b.source_schema else ""
        assert conn.execute(sa.text(f"select count(*) from {prefix}{MARKS}")).scalar_one() == 0
    assert b.cli("verify") == 0
    assert b.cli("sync", "--once") == 0
    assert b.message_ids(*TABLES) == Counter({m: 1 for m in before}) and not _entries(b)
    assert b.cli("verify") == 0


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["rollback_before_commit:1", "rollback_after_commit:1",
                                   "giveback_before_legacy_commit:1", "giveback_after_legacy_commit:1"])
def test_killed_between_any_two_commits_nothing_is_lost_or_doubled(request, tmp_path: Path, point: str) -> None:
    for b in make_bt("postgres", request, tmp_path, mode="move", batch_size=2):
        entries = _fill(b)
        assert b.cli("sync", "--once") == 0
        before = b.message_ids(*TABLES)
        kill_at(b, point, tmp_path, ["rollback", "--yes", "--job", "job1"])
        assert b.cli("sync", "--once") == 0  # a pass gives back what is owed before it reads
        assert b.cli("rollback", "--yes", "--job", "job1") == 0
        assert _entries(b) == entries
        assert b.cli("verify") == 0
        assert b.cli("sync", "--once") == 0
        assert b.message_ids(*TABLES) == Counter({m: 1 for m in before}) and not _entries(b)
        assert b.cli("verify") == 0


@pytest.mark.postgres
def test_a_message_purged_before_the_give_back_is_quarantined_and_replayed_once(request, tmp_path: Path, capsys) -> None:
    for b in make_bt("postgres", request, tmp_path, mode="move", batch_size=2):
        entries = _fill(b, 2)
        assert b.cli("sync", "--once") == 0
        before = b.message_ids(*TABLES)
        kill_at(b, "rollback_after_commit:1", tmp_path, ["rollback", "--yes", "--job", "job1"])
        purged = next(m for (kind, m, _) in entries if kind == "Q")
        with b.source.begin() as conn:  # BizTalk's cleanup purges a message no queue refers to
            s, mp = b.bt["Spool"], b.bt["MessageParts"]
            conn.execute(sa.delete(mp).where(mp.c.uidMessageID == purged))
            conn.execute(sa.delete(s).where(s.c.uidMessageID == purged))
        capsys.readouterr()
        assert b.cli("rollback", "--yes", "--job", "job1", "--json") == 0
        [w] = json.loads(capsys.readouterr().out)["queues"]
        assert w["quarantined"] == 1
        assert set(_entries(b)) == {k for k in entries if k[1] != purged}
        assert b.cli("quarantine", "replay", "--job", "job1", "--all") == 0
        assert b.cli("sync", "--once") == 0
        assert b.message_ids(*TABLES) == Counter({m: 1 for m in before})
        assert b.cli("verify") == 0
