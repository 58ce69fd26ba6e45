"""Clocks (issue 29): NGinn writes local wall-clock times. Rows whose times fall in the autumn
hour that happens twice, in the spring hour that never happens, and rows written by a legacy
server whose clock runs a few minutes ahead of qbridge's: nothing is lost, nothing is ordered
wrongly (order is NGinn's id, not a time). What can be off: a time in the repeated hour is read
as its first occurrence (CEST), so its TimeSent, and a delayed message's due time, can be an
hour early; a time in the spring gap is read with the offset before the change; a legacy clock
ahead makes the lag read 0 (it never goes negative)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from bridge.demo.samples import nginn_row
from helpers import Bridge

AUTUMN = datetime(2026, 10, 25, 2, 30)  # Europe/Warsaw: 02:00-03:00 happens twice (CEST, then CET)
SPRING = datetime(2026, 3, 29, 2, 30)  # Europe/Warsaw: 02:00-03:00 never happens


@pytest.fixture()
def bridge(on_each_db):
    return on_each_db()


def test_rows_in_the_repeated_and_the_missing_hour_arrive_once_in_id_order(bridge: Bridge) -> None:
    b = bridge
    rows = []
    for n, moment in enumerate([AUTUMN - timedelta(minutes=40), AUTUMN, AUTUMN + timedelta(minutes=20),
                                AUTUMN + timedelta(minutes=50), SPRING - timedelta(minutes=40), SPRING,
                                SPRING + timedelta(minutes=50)], start=1):
        rows.append(nginn_row("MQueue1", n, moment))
    future = datetime.now() + timedelta(days=400)
    rows.append(nginn_row("MQueue1", 8, AUTUMN, subqueue="R", retry_time=future.replace(month=10, day=25, hour=2, minute=30)))
    rows.append(nginn_row("MQueue1", 9, SPRING, subqueue="R", retry_time=future.replace(month=3, day=29, hour=2, minute=30)))
    ids = b.insert(rows)
    assert b.cli("sync", "--once") == 0
    ready = b.rows("Orders")
    assert [int(r["headers"]["NGinn.BusMessageId"]) for r in ready] == ids[:7]  # in id order, whatever the clock said
    sent = [r["headers"]["NServiceBus.TimeSent"] for r in ready]
    assert sent[1] == "2026-10-25 00:30:00:000000 Z"  # the first 02:30 (CEST); the second would be 01:30 Z
    assert sent[5] == "2026-03-29 01:30:00:000000 Z"  # 02:30 read with CET's offset: 03:30 CEST
    delayed = b.rows("Orders.Delayed")
    assert len(delayed) == 2 and all(r["headers"]["NServiceBus.DeliverAt"] for r in delayed)
    assert len(b.message_ids("Orders", "Orders.Delayed")) == 9
    assert b.cli("verify") == 0


def test_a_legacy_clock_ahead_of_qbridges_loses_nothing_and_reads_no_negative_lag(bridge: Bridge) -> None:
    b = bridge
    ahead = b.now_local() + timedelta(minutes=5)
    b.insert([nginn_row("MQueue1", n, ahead) for n in range(1, 6)])
    runner = b.runner()
    runner.check()
    stats = runner.run_pass("MQueue1")
    assert stats.delivered == 5 and stats.lag_seconds == 0.0  # sent "in the future": clamped, not negative
    assert b.count("Orders") == 5
