"""Review of 5e117d8 (a BizTalk copy-mode drain walks on after its last committed batch): guards
that every key behind the walk's start is in the ledger when the drain ends, whatever the passes'
sizes, the MessageBox's own changes meanwhile (entries consumed, instances suspended), an earlier
partial drain and a retried one; that the walk after a sort tuple is exactly the rest of the
keyset on the databases the tests have (UUIDs that sort differently by byte, instances of one
message); and that the resumed walk's statements compile for SQL Server."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from bridge.pipeline.job import LedgerConflict
from bridge.pipeline.passes import Passes
from bridge.pipeline.waiting import backlog
from tests.systems.test_biztalk_source import SMALL, BizTalk, fx, make_bt

QUEUE = "BizTalkServerApplication"
SUSPENDED = {"nState": 4, "dtSuspendTimeStamp": datetime(2024, 3, 14, 9, 27, 2), "nvcAdapter": "FILE",
             "nvcURI": "D:\\In\\*.xml", "nvcErrorDescription": "failure", "info": "routing failure"}


@pytest.fixture(params=["sqlite", "postgres"])
def bt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BizTalk]:
    yield from make_bt(request.param, request, tmp_path, batch_size=7)


def source_keys(bt: BizTalk) -> set[str]:
    """Every entry of the host's two queues, as the source spells its keys."""
    with bt.source.connect() as conn:
        return {f"{p}:{m}:{i}" for p, t in (("Q", bt.bt[f"{QUEUE}Q"]), ("S", bt.bt[f"{QUEUE}Q_Suspended"]))
                for m, i in conn.execute(sa.select(t.c.uidMessageID, t.c.uidInstanceID))}


def ledger_keys(bt: BizTalk) -> dict[str, str]:
    with bt.target.connect() as conn:
        return dict(conn.execute(sa.text(f"select source_key, outcome from {bt._qualified('qbridge_ledger')}")).all())


def exactly_once(bt: BizTalk) -> None:
    """Every entry in the MessageBox is in the ledger, and every delivered one is in the target once."""
    ledger = ledger_keys(bt)
    missing = source_keys(bt) - set(ledger)
    assert not missing, f"{len(missing)} entries the drain left behind: {sorted(missing)[:5]}"
    ids = bt.message_ids("Orders", "error")
    assert set(ids.values()) <= {1}, [k for k, n in ids.items() if n > 1]
    assert sum(ids.values()) == Counter(ledger.values())["delivered"]


def publish_mix(bt: BizTalk, rng: random.Random, n: int) -> None:
    """Ready entries, suspended ones, a few that quarantine, and messages with two instances."""
    for _ in range(n):
        r = rng.random()
        if r < 0.2:
            bt.publish(context=fx("ctx_suspended.bin"), parts=[SMALL], suspended=dict(SUSPENDED))
        elif r < 0.27:
            bt.publish(context=fx("ctx_receive.bin")[:-7], parts=[SMALL])  # quarantined
        else:
            message, _ = bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
            if r > 0.9:  # the same message for a second subscriber's instance
                with bt.source.begin() as conn:
                    conn.execute(bt.bt[f"{QUEUE}Q"].insert().values(uidMessageID=message, uidInstanceID=uuid.uuid4()))


def consume_one(bt: BizTalk, rng: random.Random) -> None:
    """BizTalk processed an entry (anywhere in the keyset): it leaves its queue."""
    keys = sorted(source_keys(bt))
    if not keys:
        return
    p, m, i = rng.choice(keys).split(":")
    t = bt.bt[f"{QUEUE}Q" if p == "Q" else f"{QUEUE}Q_Suspended"]
    with bt.source.begin() as conn:
        conn.execute(t.delete().where(t.c.uidMessageID == uuid.UUID(m), t.c.uidInstanceID == uuid.UUID(i)))


def suspend_one_new(bt: BizTalk, rng: random.Random) -> None:
    """BizTalk suspends a ready instance qbridge has not delivered yet: its entry moves from <Host>Q
    to <Host>Q_Suspended with the same ids (its S key sorts after every Q key)."""
    known = set(ledger_keys(bt))
    ready = sorted(k for k in source_keys(bt) if k.startswith("Q:") and k not in known)
    if not ready:
        return
    _, m, i = rng.choice(ready).split(":")
    m_id, i_id = uuid.UUID(m), uuid.UUID(i)
    q, s = bt.bt[f"{QUEUE}Q"], bt.bt[f"{QUEUE}Q_Suspended"]
    with bt.source.begin() as conn:
        conn.execute(q.delete().where(q.c.uidMessageID == m_id, q.c.uidInstanceID == i_id))
        conn.execute(s.insert().values(uidMessageID=m_id, uidInstanceID=i_id, nvcAdditionalInfo="suspended"))
        conn.execute(bt.bt["InstancesSuspended"].insert().values(
            uidInstanceID=i_id, **{k: v for k, v in SUSPENDED.items() if k != "info"}))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_drains_leave_nothing_behind_the_walk(bt: BizTalk, seed: int) -> None:
    """An earlier drain stopped part way; then a drain whose passes take 1..7 keys each (back-
    pressure's room), while BizTalk consumes entries anywhere and suspends undelivered ones. Nothing
    is added behind the walk, so when the drain ends every entry is in the ledger, once."""
    rng = random.Random(seed)
    publish_mix(bt, rng, 45)
    first = bt.runner()
    passes = {"n": 0}

    def count(_: Any) -> None:
        passes["n"] += 1

    first.drain(QUEUE, on_pass=count, should_stop=lambda: passes["n"] >= 2)
    assert 0 < sum(Counter(ledger_keys(bt).values()).values()) < 45

    runner = bt.runner()
    runner.pressure.room = lambda: rng.randint(1, 7)
    source, resumed = runner.sources[QUEUE], {"n": 0}
    walk = source.iter_aged

    def counted(conn: sa.Connection, after: Any = None, page: int = 10_000) -> Iterator[Any]:
        resumed["n"] += after is not None
        return walk(conn, after, page)

    source.iter_aged = counted

    def meddle(_: Any) -> None:
        if rng.random() < 0.4:
            consume_one(bt, rng)
        if rng.random() < 0.4:
            suspend_one_new(bt, rng)

    total = runner.drain(QUEUE, on_pass=meddle)
    assert total.waiting is None and resumed["n"] >= 2  # the passes after the first walked on
    exactly_once(bt)
    again = bt.runner().drain(QUEUE)
    assert again.delivered == again.quarantined == 0
    assert bt.cli("verify") == 0


def test_a_retried_drain_after_a_ledger_conflict_delivers_each_once(bt: BizTalk, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sync --once` retries a drain whose third pass met a racing process (LedgerConflict): the
    retry walks from the first key again, and every entry comes once."""
    rng = random.Random(7)
    publish_mix(bt, rng, 40)
    original, calls = Passes._deliver, {"n": 0}

    def conflicts_third(self: Any, *a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise LedgerConflict("another qbridge process delivered messages at the same time")
        return original(self, *a, **k)

    monkeypatch.setattr(Passes, "_deliver", conflicts_third)
    assert bt.cli("sync", "--once") == 0
    assert calls["n"] > 3
    exactly_once(bt)
    assert bt.cli("verify") == 0


def test_the_walk_after_each_key_is_the_rest_of_the_keyset(bt: BizTalk) -> None:
    """The database compares the sort tuple (not Python): for ids that differ in the bytes SQL
    Server weighs first, last or in between, and for instances of one message, the walk after
    each key's sort tuple is exactly the keys after it in the walk from the start."""
    q, s = bt.bt[f"{QUEUE}Q"], bt.bt[f"{QUEUE}Q_Suspended"]
    crafted = [uuid.UUID(int=1 << (8 * b)) for b in range(16)] + [uuid.UUID(int=(1 << 128) - 1 - (1 << (8 * b)))
                                                                  for b in range(0, 16, 5)]
    for n, low in enumerate(crafted):
        message, _ = bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL],
                                suspended=dict(SUSPENDED) if n % 3 == 0 else None)
        t = s if n % 3 == 0 else q
        with bt.source.begin() as conn:
            for name in ("Spool", "MessageParts"):
                table = bt.bt[name]
                conn.execute(table.update().where(table.c.uidMessageID == message).values(uidMessageID=low))
            conn.execute(t.update().where(t.c.uidMessageID == message).values(uidMessageID=low))
            for other in crafted[:3]:  # more instances of the same message: the second column decides
                conn.execute(t.insert().values(uidMessageID=low, uidInstanceID=other))
    runner = bt.runner()
    source = runner.sources[QUEUE]
    with bt.source.connect() as conn:
        walk = [k for k, _ in source.iter_aged(conn)]
        assert len(walk) == len(set(walk)) == 4 * len(crafted)
        assert walk == sorted(walk, key=lambda k: k[0])[:len(walk)]  # every Q key before every S key
        for at, key in enumerate(walk):
            after = [k for k, _ in source.iter_aged(conn, source.sort_of(key))]
            assert after == walk[at + 1:], key
    total = runner.drain(QUEUE)
    assert total.read == total.delivered + total.quarantined == len(walk)  # instances unlike S's lack a row: quarantined
    exactly_once(bt)


def test_resumed_walk_statements_compile_for_sql_server(bt: BizTalk) -> None:
    """SQL Server has no row values: the walk after a Q key reads the rest of <Host>Q and all of
    <Host>Q_Suspended, after an S key only the rest of <Host>Q_Suspended; each spelled as ORs."""
    source = bt.runner().sources[QUEUE]
    m, i = uuid.uuid4(), uuid.uuid4()
    dialect = mssql.dialect()
    after_q = source._slices(("Q", m, i), None, "mssql")
    after_s = source._slices(("S", m, i), None, "mssql")
    assert len(after_q) == 2 and len(after_s) == 1
    texts = [str(stmt.compile(dialect=dialect)) for stmt in (*after_q, *after_s)]
    assert f"{QUEUE}Q_Suspended" not in texts[0] and f"{QUEUE}Q_Suspended" in texts[2]
    for text in (texts[0], texts[2]):
        assert " OR " in text and "ORDER BY" in text
        assert "[uidMessageID] > " in text and "[uidInstanceID] > " in text
    assert "WHERE" not in texts[1]  # the suspended queue whole, after a Q key


def test_an_instance_resumed_behind_the_walk_comes_in_the_same_drain(bt: BizTalk) -> None:
    """An operator's resume of a suspended instance not delivered yet (S -> Q, same ids) after the
    walk passed its Q position. The review's first note: at 5e117d8 the drain ended without it
    (the backlog counted it, the next drain delivered it); now the drain's last pass walks from the
    first key again and delivers it once, and nothing is left waiting."""
    for _ in range(30):
        bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
    message, instance = bt.publish(context=fx("ctx_suspended.bin"), parts=[SMALL], suspended=dict(SUSPENDED))
    low = uuid.UUID(int=1)  # sorts before every Q key
    q, s = bt.bt[f"{QUEUE}Q"], bt.bt[f"{QUEUE}Q_Suspended"]
    with bt.source.begin() as conn:
        for name in ("Spool", "MessageParts"):
            t = bt.bt[name]
            conn.execute(t.update().where(t.c.uidMessageID == message).values(uidMessageID=low))
        conn.execute(s.update().where(s.c.uidMessageID == message).values(uidMessageID=low))
    runner = bt.runner()
    done: list[bool] = []

    def resume(_: Any) -> None:
        if not done and (runner.walked_to.get(QUEUE) or ("",))[0] == "Q":
            with bt.source.begin() as conn:
                conn.execute(s.delete().where(s.c.uidMessageID == low))
                conn.execute(bt.bt["InstancesSuspended"].delete().where(bt.bt["InstancesSuspended"].c.uidInstanceID == instance))
                conn.execute(q.insert().values(uidMessageID=low, uidInstanceID=instance))
            done.append(True)

    runner.drain(QUEUE, on_pass=resume)
    assert done
    assert f"Q:{low}:{instance}" in ledger_keys(bt)
    assert backlog(bt.runner()) == {QUEUE: 0}
    assert bt.runner().drain(QUEUE).delivered == 0
    exactly_once(bt)
