"""The fast lane (Source.plain + Target.plain_envelope) gives exactly what the validated path
gives: the same rows, headers in the same order, ledger entries, quarantine, skips and consumes,
for every kind of NGinn row, ordinary and hostile, under mappings that take it and ones that don't."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bridge.pipeline.loop import PassStats
from bridge.demo.samples import nginn_body, nginn_row
from helpers import MAPPING, Bridge


def corpus(now: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(n: int, **kw: Any) -> None:
        columns = {k: kw.pop(k) for k in list(kw) if k in ("correlation_id", "label", "unique_id", "retry_count",
                                                             "to_endpoint", "from_endpoint", "insert_time", "last_processed")}
        row = nginn_row("MQueue1", n, now, **kw)
        row.update(columns)
        rows.append(row)

    add(1, headers="_NG-ReplyTo=sql://db/Sender|Tenant=acme|_NG-Seq=7")
    add(2, headers="_NG-ReplyTo=not-an-sql-endpoint|Region=eu")
    add(3, headers="")
    add(4, headers=None)
    add(5, headers="_NG_MsgType=Orders.FromHeader, Orders", body='{"OrderId": 5}')
    add(6, headers="_NG_MsgType=Orders.FromHeader, Orders", body="[1, 2, 3]")
    add(7, body="{not json")
    add(8, body='{"$type": 5}')
    add(9, headers="broken-pair-without-equals")
    add(10, headers="a=b=c")
    add(11, headers=f"_NG-TTL={(now + timedelta(days=1)):%Y-%m-%d %H:%M:%S}")
    add(12, headers=f"_NG-TTL={(now - timedelta(days=1)):%Y-%m-%d %H:%M:%S}")
    add(13, headers="_NG-TTL=tomorrow")
    add(14, headers="QBridge.Source=nservicebus://nsb/Orders/abc")
    add(15, headers="QBridge.Source=nginn://elsewhere/Other/1")
    add(16, headers='Quote=say "hi"|Slash=a/b\\c|Tab=x\ty|Uni=zażółć 日本', correlation_id=None, label=None, unique_id=None)
    add(17, correlation_id="", label="", unique_id="", retry_count=4)
    add(18, retry_count=-1)
    add(19, to_endpoint="msmq://elsewhere/Q", from_endpoint="")
    add(20, to_endpoint="sql://db/Billing")
    add(21, body=nginn_body("Unknown.Type, Nowhere", X=1))
    add(22, subqueue="X")
    add(23, subqueue="X", body="{broken")
    add(24, subqueue="X", headers="no-equals-here")
    add(25, subqueue="R", retry_time=now + timedelta(hours=1))
    add(26, subqueue="F", error_info="System.Exception: boom\r\n   at X.Y()")
    add(27, subqueue="Z")
    add(28, body="")
    add(29, headers="  Spaced  =  value  |=empty-name|empty-value=")
    add(30, subqueue="R", retry_time=now - timedelta(hours=1), headers="_NG-ReplyTo=sql://db/Sender|Tenant=x")
    add(31, subqueue="R", retry_time=now + timedelta(days=2), headers=f"_NG-TTL={(now + timedelta(days=1)):%Y-%m-%d %H:%M:%S}")
    add(32, subqueue="F", error_info=None)
    add(33, subqueue="F", error_info="   ")
    add(34, subqueue="F", error_info="the disk was full\nsecond line")
    add(35, subqueue="F", error_info="System.InvalidOperationException: outer ---> System.IO.IOException: inner\r\n"
                                     "   at A.B()\r\n   --- End of inner exception stack trace ---\r\n   at C.D()")
    add(36, subqueue="F", error_info="System.Exception: no time", last_processed=None, retry_time=now - timedelta(hours=2))
    add(37, subqueue="F", error_info="System.Exception: " + "long " * 5000 + "\r\n   at X.Y()")
    add(38, subqueue="F", error_info="System.Exception: boom", headers=f"_NG-TTL={(now + timedelta(days=1)):%Y-%m-%d %H:%M:%S}")
    add(39, subqueue="F", error_info="System.Exception: boom", body="{broken")
    add(40, subqueue="F", error_info="System.Exception: boom", headers="_NG-ReplyTo=sql://db/Sender|Tenant=acme")
    return rows


def _mapping(**states: str) -> str:
    text = MAPPING
    for state, action in states.items():
        old = next(line for line in text.splitlines() if line.startswith(f"{state} ="))
        text = text.replace(old, f'{state} = "{action}"')
    return text


MAPPINGS = {
    "test mapping": MAPPING,
    "ready skipped": _mapping(ready="skip"),
    "ready and processed audited": _mapping(ready="audit", processed="audit"),
    "ready delayed, delayed queued": _mapping(ready="delayed", delayed="queue"),
    "delayed skipped": _mapping(delayed="skip"),
    "failed queued": _mapping(failed="queue"),
    "failed skipped": _mapping(failed="skip"),
    "failed delayed": _mapping(failed="delayed"),
    "only a * route, no templates": MAPPING.replace('"MQueue1" = "Orders"\n', "").replace(
        '[headers.set]\n"Acme.Origin" = "legacy {queue}#{key}"\n', ""),
}


def _lanes(b: Bridge, lock: bool) -> tuple[Any, Any]:
    runner = b.runner()
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    assert len(rows) == len(corpus(b.now_local()))
    results = []
    for fast in (True, False):
        runner.fast_lane = fast
        stats = PassStats("MQueue1")
        # Fresh copies: the lanes must not see each other's header dicts.
        copies = [r._replace(values=dict(r.values)) for r in rows]
        outs, entries, quarantined, consume = runner._process(None, source, copies, lock, stats, {})
        results.append((outs, entries, [(q.message_id, q.source_key, q.reason) for q in quarantined], consume,
                        (stats.delivered, stats.skipped, stats.quarantined, stats.already), stats.lag_seconds is not None))
    return results[0], results[1]


@pytest.mark.parametrize("mapping", list(MAPPINGS))
@pytest.mark.parametrize("lock", [False, True], ids=["copy", "move"])
def test_the_fast_lane_and_the_validated_path_agree_on_every_row(tmp_path: Path, mapping: str, lock: bool) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", mapping=MAPPINGS[mapping])
    assert b.cli("init") == 0
    b.insert(corpus(b.now_local()))
    fast, validated = _lanes(b, lock)
    assert fast[0] and fast[1]
    f_outs, v_outs = fast[0], validated[0]
    assert len(f_outs) == len(v_outs)
    for f, v in zip(f_outs, v_outs):
        assert f == v
        assert list(f.headers) == list(v.headers)  # the same order: the JSON text is the same
    assert fast[1:] == validated[1:]


def test_the_fast_lane_takes_the_common_rows_and_declines_the_rest(tmp_path: Path) -> None:
    """Not vacuous: under the test mapping the ordinary rows, failed ones included, go through the
    lane; the ones whose rules need the full message (TTL, echo tags, anything unreadable) do not."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    ids = b.insert(corpus(b.now_local()))
    runner = b.runner()
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        rows = source.fetch_after(conn, None, 1000, False)
    taken = {ids.index(r.key) + 1 for r in rows
             if runner.fast_map(source, r._replace(values=dict(r.values)), str(runner.message_id(source, r)),
                              source.translated_headers) is not None}
    assert {1, 2, 3, 4, 5, 6, 16, 17, 19, 20, 22, 25, 26, 29, 30, 32, 33, 34, 35, 36, 37, 40} <= taken
    assert not taken & {7, 8, 9, 10, 11, 12, 13, 14, 15, 18, 23, 24, 27, 28, 31, 38, 39}


def test_a_driver_handing_over_other_types_gets_the_same_outcome_both_ways(tmp_path: Path) -> None:
    """Values of a type the model would refuse (a driver's int or bytes where NGinn has text)
    are quarantined by the validated path; the lane must not deliver them instead."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    b.insert(corpus(b.now_local())[:1])
    runner = b.runner()
    source = runner.sources["MQueue1"]
    with runner.source_engine.connect() as conn:
        [row] = source.fetch_after(conn, None, 10, False)
    # Each odd row under a key of its own: copies of one key in a batch count once (issue 25).
    odd = [row._replace(key=row.key + i, values={**row.values, "id": row.key + i, column: value})
           for i, (column, value) in enumerate((("label", 7), ("unique_id", b"raw"), ("correlation_id", 1.5), ("retry_count", True)))]
    results = []
    for fast in (True, False):
        runner.fast_lane = fast
        outs, entries, quarantined, _ = runner._process(None, source, [r._replace(values=dict(r.values)) for r in odd],
                                                        False, PassStats("MQueue1"), {})
        results.append((outs, entries, [(q.source_key, q.reason) for q in quarantined]))
    assert results[0] == results[1]
    # The validated path refuses the text columns; a bool retry count it reads as a number.
    assert len(results[1][2]) == 3 and len(results[1][0]) == 1
