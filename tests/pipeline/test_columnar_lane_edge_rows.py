"""Edge rows of the columnar lane (issue 37), each found by a fresh-eyes review as a row the lane
wrote otherwise than the per-row lanes, or a batch it failed where they settle the row: times
after 2037 and before the year 1000, a control character in a body's `$type` or a
`to_endpoint` (which the group's example carries as they are), values that ran two group keys
together, and an exception inside the lane. Each compares the two lanes on the same rows with
`both_lanes` (tests/pipeline/test_columnar_lane.py)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import sqlite_nginn

from bridge.demo.samples import nginn_body, nginn_row
from tests.pipeline.test_columnar_lane import both_lanes


def test_a_delayed_row_due_after_2037_gets_the_same_due_time(tmp_path: Path) -> None:
    """Arrow's assume_timezone stops applying DST after 2037 (apache/arrow#36110), zoneinfo
    applies the TZif footer rule: 12:00 in Warsaw on 1 July 2040 is 10:00 UTC, the lane says
    11:00 UTC, in both the DeliverAt header and the .Delayed table's due column. The lane's
    `sure` check (earliest == latest) does not see it: the time is not ambiguous for Arrow."""
    now = datetime.now().replace(microsecond=0)
    b = sqlite_nginn(tmp_path, [nginn_row("MQueue1", 1, now, subqueue="R", retry_time=datetime(2040, 7, 1, 12, 0))])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row


def test_a_row_sent_before_the_year_1000_gets_the_same_time_sent(tmp_path: Path) -> None:
    """The lane writes wire times with strftime('%Y'), which glibc does not pad to four digits
    ('999-06-01 ...'); to_wire writes '0999-06-01 ...'."""
    b = sqlite_nginn(tmp_path, [{**nginn_row("MQueue1", 1, datetime(999, 6, 1, 12, 0)),
                            "retry_time": datetime(2026, 6, 1, 12, 0)}])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row


def test_a_time_whose_utc_falls_before_year_1_is_quarantined_not_a_failed_batch(tmp_path: Path) -> None:
    """0001-01-01 00:30 in Warsaw (LMT +01:24) is in year 0 in UTC: the per-row lanes quarantine
    the row (OverflowError, caught); the lane's _wire raises OverflowError out of the batch, on
    every retry, so no row of the queue behind it is ever delivered."""
    now = datetime.now().replace(microsecond=0)
    b = sqlite_nginn(tmp_path, [nginn_row("MQueue1", 1, now),
                           {**nginn_row("MQueue1", 2, datetime(1, 1, 1, 0, 30)), "retry_time": now}])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row


@pytest.mark.parametrize("marker", ["key", "nosuch"])
def test_a_nul_marker_in_the_body_type_is_written_as_it_is(tmp_path: Path, marker: str) -> None:
    """The body's $type reaches the group's example as a real value: a type holding `\\x00key\\x00`
    was taken for the key's marker, and the row's key written into
    NServiceBus.EnclosedMessageTypes in its place; a name that is no column (`nosuch`) raised
    KeyError out of the batch on every retry, where the per-row lanes deliver the row."""
    now = datetime.now().replace(microsecond=0)
    body = '{"$type": "Orders.Evil\\u0000%s\\u0000, Orders", "OrderId": 1}' % marker
    b = sqlite_nginn(tmp_path, [nginn_row("MQueue1", 1, now, body=body)])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row


def test_rows_whose_type_and_to_endpoint_differ_are_not_one_group(tmp_path: Path) -> None:
    """The group key joins the legacy type and to_endpoint with \\x1e, and neither is checked for
    it: type 'T\\x1eX' with to_endpoint 'sql://db/MQueue1', and type 'T' with to_endpoint
    'X\\x1esql://db/MQueue1', make the same key, so the second row is written from the first
    row's example (its type and NGinn.ToEndpoint are the first row's)."""
    now = datetime.now().replace(microsecond=0)
    first = nginn_row("MQueue1", 1, now, body='{"$type": "T\\u001eX", "OrderId": 1}')
    second = {**nginn_row("MQueue1", 2, now, body=nginn_body("T", OrderId=2)), "to_endpoint": "X\x1esql://db/MQueue1"}
    b = sqlite_nginn(tmp_path, [first, second])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row


def test_a_row_without_headers_and_a_row_with_one_empty_name_are_not_one_group(tmp_path: Path) -> None:
    """The group key joins the header names with \\x1f: no names at all ([]) and one empty name
    ([""], from the pair '=secret', which NGinn's format allows and the per-row lanes write as the
    header "") join alike. The row without headers is then rendered from the example with the
    header "", filled with marker L0 at its own header start, which is the next lane row's first
    header value: row 2 is written with row 3's Tenant under the name ""."""
    now = datetime.now().replace(microsecond=0)
    b = sqlite_nginn(tmp_path, [nginn_row("MQueue1", 1, now, headers="=secret"),
                           nginn_row("MQueue1", 2, now, headers=None),
                           nginn_row("MQueue1", 3, now, headers="Tenant=acme")])
    columnar, per_row = both_lanes(b, False)
    assert columnar == per_row


def test_an_error_inside_the_lane_sends_the_batch_to_the_per_row_lanes_and_is_said_once(
        tmp_path: Path, caplog: Any) -> None:
    """Whatever the lane trips over, the queue does not stop behind it: the batch takes the
    per-row lanes, and the warning (with its trace) comes once per queue, not once per batch."""
    import logging

    from bridge.pipeline.loop import PassStats

    now = datetime.now().replace(microsecond=0)
    b = sqlite_nginn(tmp_path, [nginn_row("MQueue1", n, now, headers="Tenant=acme") for n in range(1, 81)])
    runner = b.runner()
    runner.lane_min_rows = 1  # 80 rows: fewer than NGinn's own threshold
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)

    def broken(*_: Any) -> Any:
        raise RuntimeError("a lane bug")

    runner.target.plain_columns = broken  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG, logger="qbridge.batch")
    for _ in range(3):
        stats = PassStats("MQueue1")
        outs, entries, quarantined, _consume = runner._settle(None, source, rows, False, stats, {})
        assert stats.delivered == 80 and len(outs) == 80 and not quarantined
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "columnar lane failed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is not None
