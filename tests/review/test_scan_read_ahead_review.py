"""A helper review of the scan read-ahead (session 15, on 1df448a). Its finding: an OpenJMS reserve
batch read ahead was delivered as it was at the previous pass's write, with no look at the store
at the pass that delivered it: a handle the legacy consumer acknowledged after that read, before
the pass ran, was still delivered, where the pass's own fetch skips it; its redelivered flag was
the one of that earlier moment. Fixed by reading ahead only where the next pass walks its keys
(BizTalk). Each test runs with and without the read-ahead. And the guards for BizTalk, whose next
pass's walk comes after the read-ahead's fetch began: an entry consumed or suspended meanwhile is
neither delivered from the rows read ahead nor lost."""

from __future__ import annotations

from typing import Any

import pytest

from tests.pipeline.test_read_ahead_scan import HOST, _publish, bt  # noqa: F401 - the fixture
from tests.pipeline.test_scan_reserve import QUEUE, fill, key


def _ack(jms: Any, mid: str) -> None:
    """The legacy consumer acknowledges `mid`: OpenJMS deletes its handle, then the message."""
    def go(c: Any, t: Any) -> None:
        c.execute(t["message_handles"].delete().where(t["message_handles"].c.messageid == mid))
        c.execute(t["messages"].delete().where(t["messages"].c.messageid == mid))
    jms.store(go)


@pytest.mark.parametrize("read_ahead", [False, True])
def test_a_handle_acknowledged_before_its_pass_is_not_delivered(pgjms: Any, read_ahead: bool) -> None:
    fill(pgjms)  # 30 handles; the walk keeps m-29..m-21 (oldest first), pass 1 takes 29, 28, 27
    runner = pgjms.runner()
    runner.read_ahead.on = read_ahead
    done: list[Any] = []

    def after_pass(stats: Any) -> None:
        done.append(stats)
        if len(done) == 1:  # pass 1 committed; pass 2 (26, 25, 24 from the reserve) has not begun
            _ack(pgjms, "ID:m-25")

    runner.drain(QUEUE, on_pass=after_pass)
    ids = pgjms.message_ids("Orders")
    delivered = {r["headers"]["QBridge.Source"].rsplit("/", 1)[-1] for r in pgjms.rows("Orders")}
    # Without the read-ahead: 29 delivered, m-25 not (gone before any pass read it).
    assert key(25) not in delivered, (f"read_ahead={read_ahead}: m-25, acknowledged before pass 2 began, was "
                                      f"delivered (taken read ahead: {runner.read_ahead.taken})")
    assert len(ids) == 29 and set(ids.values()) == {1}


@pytest.mark.parametrize("read_ahead", [False, True])
def test_the_redelivered_flag_is_the_one_at_the_pass(pgjms: Any, read_ahead: bool) -> None:
    fill(pgjms)
    runner = pgjms.runner()
    runner.read_ahead.on = read_ahead
    done: list[Any] = []

    def after_pass(stats: Any) -> None:
        done.append(stats)
        if len(done) == 1:  # OpenJMS delivers m-25 to a consumer (not yet acknowledged)
            pgjms.store(lambda c, t: c.execute(t["message_handles"].update()
                                                .where(t["message_handles"].c.messageid == "ID:m-25").values(delivered=1)))

    runner.drain(QUEUE, on_pass=after_pass)
    [row] = [r for r in pgjms.rows("Orders") if r["headers"]["QBridge.Source"].endswith("/" + key(25))]
    assert row["headers"]["JMS.Redelivered"] == "true", f"read_ahead={read_ahead}"


def _keys(b: Any, runner: Any) -> list[str]:
    with b.source.connect() as conn:
        return [k for k, _ in runner.sources[HOST].iter_aged(conn)]


def _test(b: Any, change) -> Any:
    _publish(b, 20)
    runner = b.runner()
    keys = _keys(b, runner)
    victim = keys[6]  # in pass 2's batch (keys 5..9), which pass 1 reads ahead
    calls: list[int] = []

    def before_pass() -> None:
        calls.append(1)
        if len(calls) == 2:
            change(victim)

    runner.drain(HOST, before_pass=before_pass)
    return runner, victim


def test_an_entry_biztalk_consumed_after_the_read_ahead_is_not_delivered(bt: Any) -> None:  # noqa: F811
    def consume(victim: str) -> None:
        _, m, i = victim.split(":")
        q = bt.bt[f"{HOST}Q"]
        with bt.source.begin() as conn:
            assert conn.execute(q.delete().where(q.c.uidMessageID == m, q.c.uidInstanceID == i)).rowcount == 1

    _test(bt, consume)
    ids = bt.message_ids("Orders")
    assert len(ids) == 19 and set(ids.values()) == {1}
    assert bt.ledger() == {"delivered": 19}


def test_an_entry_suspended_after_the_read_ahead_is_delivered_once_as_suspended(bt: Any) -> None:  # noqa: F811
    def suspend(victim: str) -> None:
        _, m, i = victim.split(":")
        q, s, inst = bt.bt[f"{HOST}Q"], bt.bt[f"{HOST}Q_Suspended"], bt.bt["InstancesSuspended"]
        with bt.source.begin() as conn:
            conn.execute(q.delete().where(q.c.uidMessageID == m, q.c.uidInstanceID == i))
            conn.execute(s.insert().values(uidMessageID=m, uidInstanceID=i))
            conn.execute(inst.insert().values(uidInstanceID=i, nState=4, nvcErrorDescription="boom"))

    runner, _ = _test(bt, suspend)
    ids = bt.message_ids("Orders")
    assert len(ids) == 19 and set(ids.values()) == {1}
    assert bt.ledger() == {"delivered": 20}  # 19 Q entries, and the S one (to the error queue)
    assert runner.read_ahead.taken >= 1
