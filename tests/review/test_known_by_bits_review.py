"""Review of 399a94b (a copy-mode pass of a range-ledger queue finds its known keys by the bits
alone), f000060 (a monotonic read-ahead's thread imports Arrow/ADBC first) and 3e651c4 (block_bits
64 keys at a time; write_lane's parts as one chunked array).

399a94b rests on "every key ever recorded for a ranged queue has its bit". `qbridge init`'s fold
(bridge/ledger/ranges_upgrade.py) breaks it where the range ledger is already in place (a DBA made
it from `--print-sql`'s DDL, or a fold was cut off and resumed): `unfolded` looks only at delivered
and skipped entries, so a queue's QUARANTINED entries can be left without a bit, and then neither
`init` folds them nor `JobSetup.check_ledger` refuses. Before 399a94b a copy pass still read those
entries; now it delivers such a message, and `quarantine replay` (its entry still says quarantined)
delivers it a second time.

Each test says whether it FAILED (a defect: each failed at 3e651c4 and passes since a63fe94, which
folds a queue with any entry lacking a bit, and c98cfa0, which imports the lane's modules before a
second thread may) or PASSES (a guard).
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from helpers import BY_TYPE, FIXED, IMPORT_SPY, run_two_jobs, unfold_ranges, unrouted_rows

from bridge.demo.samples import nginn_row
from bridge.ledger import ranges_upgrade
from bridge.ledger.ranges import Ranges
from bridge.lifecycle.quarantine import QuarantineDesk

QUEUE = "MQueue1"



def _rewound(b: Any) -> None:
    """The queue's checkpoint as before its first pass (as tests/ledger/test_known_by_bits.py does):
    what a rollback's lowered checkpoint, a renamed job or a second job on the queue also read again."""
    runner = b.runner()
    c = runner.state.checkpoint
    with runner.target_engine.begin() as conn:
        conn.execute(sa.update(c).where(c.c.queue == QUEUE).values(high=None, gaps="[]"))


def _ids(b: Any) -> Counter[str]:
    return b.message_ids("Orders")


def _bits_of(b: Any, keys: list[int]) -> dict[int, str]:
    runner = b.runner()
    with runner.target_engine.connect() as conn:
        return runner.state.ranges.lookup(conn, runner.origins[QUEUE], keys)


def _dba_creates_the_range_ledger(b: Any) -> None:
    """A DBA given `qbridge init --print-sql` creates qbridge_ledger_ranges from its DDL."""
    runner = b.runner()
    runner.state.ranges.table.create(runner.target_engine)


def _then_fixed_re_read_and_replayed(b: Any) -> list[Any]:
    """The operator routes the type, a copy pass reads the queue again, the quarantine is replayed."""
    b.mapping = FIXED
    b.write_config()
    _rewound(b)
    passes: list[Any] = []
    b.runner().drain(QUEUE, passes.append)
    QuarantineDesk(b.runner(), "ops", None).replay(None)
    return passes


class Killed(BaseException):
    pass


def _init_killed_before_quarantined_bits(b: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`qbridge init` folding the queue, killed in the transaction that gives its quarantined
    entries their bits: since 413e9fd the fold's first, so nothing is folded yet and the queue
    stays unfolded (the order an earlier qbridge folded in, quarantined bits last, is
    tests/review/test_fold_order_review.py's)."""

    class KilledBeforeQuarantined(Ranges):
        def mark(self, conn: Any, origin: int, outcomes: Any, merge: bool = False, arrays: Any = ()) -> None:
            outcomes = list(outcomes)
            if any(o == "quarantined" for _, o in outcomes):
                raise Killed("init killed before the queue's quarantined entries got their bits")
            super().mark(conn, origin, outcomes, merge, arrays)

    monkeypatch.setattr(ranges_upgrade, "Ranges", KilledBeforeQuarantined)
    with pytest.raises(Killed):
        b.cli("init")
    monkeypatch.undo()


# -- 399a94b: quarantined entries without a bit ---------------------------------------------------


def test_a_quarantined_only_queue_beside_a_dba_made_range_ledger_is_delivered_twice(make) -> None:
    """FAILED (defect, fixed). An earlier qbridge (per-message ledger) quarantined every message of the
    queue so far (no route for their type). The DBA creates qbridge_ledger_ranges from the printed
    DDL; `qbridge init` then folds only queues with a delivered or skipped entry lacking a bit
    (`unfolded`), so these quarantined entries never get a bit, and no command refuses. The
    operator routes the type; a copy pass reads the queue again (a rollback's lowered checkpoint, a
    renamed job): with bits_only it no longer sees the entries and DELIVERS the messages, while
    their entries and quarantine rows still say quarantined; `quarantine replay` delivers each a
    second time. Before 399a94b the pass read the entries: 'already there', and the replay
    delivered each once."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {1, 2, 3}, 3))
    assert b.cli("sync", "--once") == 0
    assert b.ledger() == {"quarantined": 3} and b.count("Orders") == 0
    assert unfold_ranges(b) == 0  # as an earlier qbridge left it: the three entries, no range ledger
    _dba_creates_the_range_ledger(b)
    assert b.cli("init") == 0
    assert b.cli("status") == 0  # nothing refuses the ledger

    passes = _then_fixed_re_read_and_replayed(b)
    ids = _ids(b)
    assert len(ids) == 3 and all(n == 1 for n in ids.values()), f"delivered twice: {ids}"
    assert sum(p.delivered for p in passes) == 0 and sum(p.already for p in passes) == 3


def test_a_fold_cut_off_before_a_queues_quarantined_bits_never_gives_them_bits(make, monkeypatch) -> None:
    """FAILED (defect, fixed). The range ledger in place (DBA-made), `init` folds the queue: its delivered
    entries become bits and are deleted chunk by chunk, then, in a transaction of its own, its
    quarantined entries get their bits. A kill between the two leaves nothing `unfolded` sees (it
    looks at delivered and skipped entries only): the next `init` does nothing, and every command
    runs. The quarantined message (no bit) is then delivered by a copy pass that reads it again and
    once more by its replay. The docstring of ranges_upgrade promises a fold cut off anywhere resumes."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {3}, 6))
    assert b.cli("sync", "--once") == 0
    assert b.ledger() == {"delivered": 5, "quarantined": 1}
    assert unfold_ranges(b) == 5
    _dba_creates_the_range_ledger(b)
    _init_killed_before_quarantined_bits(b, monkeypatch)
    assert b.cli("init") == 0  # the fold resumed (so its docstring says)
    assert b.cli("status") == 0
    ids = [int(k) for k in b.subqueues()]
    quarantined_key = sorted(ids)[2]
    assert _bits_of(b, [quarantined_key]) == {quarantined_key: "quarantined"}, "the quarantined entry has no bit"


def test_after_a_cut_off_fold_the_quarantined_message_is_delivered_twice(make, monkeypatch) -> None:
    """FAILED (defect, fixed). The consequence of the cut-off fold above: the operator routes the type, a
    copy pass reads the queue again (bits_only: the quarantined key is unknown, so it is delivered;
    the five delivered ones are 'already there'), and `quarantine replay` delivers it again."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {3}, 6))
    assert b.cli("sync", "--once") == 0
    assert unfold_ranges(b) == 5
    _dba_creates_the_range_ledger(b)
    _init_killed_before_quarantined_bits(b, monkeypatch)
    assert b.cli("init") == 0

    passes = _then_fixed_re_read_and_replayed(b)
    ids = _ids(b)
    assert len(ids) == 6 and all(n == 1 for n in ids.values()), f"delivered twice: {ids}"
    assert sum(p.already for p in passes) == 6 and sum(p.delivered for p in passes) == 0


def test_guard_a_fresh_fold_gives_quarantined_entries_their_bits(make) -> None:
    """PASSES (guard). Where init creates the range ledger itself (no table yet), every queue of the
    config is folded, its quarantined entries given bits: a copy pass reading the queue again finds
    the quarantined message by its bit alone, and the replay delivers it once."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {3}, 6))
    assert b.cli("sync", "--once") == 0
    assert unfold_ranges(b) == 5
    assert b.cli("init") == 0
    passes = _then_fixed_re_read_and_replayed(b)
    ids = _ids(b)
    assert sum(p.already for p in passes) == 6 and sum(p.delivered for p in passes) == 0
    assert len(ids) == 6 and all(n == 1 for n in ids.values())
    assert b.cli("verify") == 0


def test_guard_a_rollback_of_a_replayed_message_clears_entry_and_bit_together(make) -> None:
    """PASSES (guard). A replayed message (entry 'delivered', bit 'quarantined') withdrawn by
    `qbridge rollback`: its entry and bit go in one transaction, the checkpoint is lowered, and the
    next copy pass (bits only) delivers each withdrawn message once more, once."""
    b = make(batch_size=10, mapping=BY_TYPE)
    b.insert(unrouted_rows(b.now_local(), {3}, 6))
    assert b.cli("sync", "--once") == 0
    b.mapping = FIXED
    b.write_config()
    [o] = QuarantineDesk(b.runner(), "ops", None).replay(None)
    assert o.action == "replayed" and b.count("Orders") == 6
    assert b.cli("rollback", "--job", "job1", "--yes") == 0
    assert b.count("Orders") == 0 and b.ledger() == {}
    assert b.cli("sync", "--once") == 0
    ids = _ids(b)
    assert len(ids) == 6 and all(n == 1 for n in ids.values())
    assert b.cli("verify") == 0


# -- 3e651c4: write_lane's chunked parts -----------------------------------------------------------


@pytest.mark.parametrize("flavor", ["postgresql", "sqlserver"])
def test_guard_lane_parts_and_per_row_rows_keep_batch_order_with_tracing(make, flavor: str, monkeypatch) -> None:
    """PASSES (guard). A batch whose Orders rows come from several lane groups (different header
    sets) and from the per-row lanes (rows the lane leaves out: a tab in a header), interleaved,
    traced: the chunked headers go through pc.if_else beside plain arrays and one take into batch
    order. The table's seq follows the keys, on COPY (postgresql) and on `_rows` (sqlserver flavor
    on PostgreSQL), each row with its own body and one traceparent, as the per-row lanes write it."""
    from bridge import tracing

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    monkeypatch.setattr(tracing, "traceparent", lambda: parent)
    b = make(batch_size=100, flavor=flavor)
    now = b.now_local()
    shapes = ["Tenant=a", "Tenant=b|Region=x", "", "Tenant=bad\tone", "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]
    b.insert([nginn_row(QUEUE, i, now, headers=shapes[i % len(shapes)]) for i in range(1, 61)])

    def written(columnar: bool) -> list[tuple[Any, ...]]:
        runner = b.runner()
        runner.lane_min_rows = 1
        runner.columnar = columnar
        runner.target.writer.trace_messages = True
        source = runner.sources[QUEUE]
        with runner.source_engine.connect() as conn:
            rows = source.fetch_after(conn, None, 100, False)
        from bridge.pipeline.stats import PassStats

        t = sa.Table("Orders", sa.MetaData(), schema=b.target_schema, autoload_with=b.target)
        cols = {c.name.lower(): c for c in t.c}
        with runner.target_engine.connect() as tconn:
            tx = tconn.begin()
            outs, *_ = runner._settle(tconn, source, rows, False, PassStats(QUEUE), {})
            runner.target.write(tconn, outs)
            seq = cols.get("seq", cols.get("rowversion"))  # the SQL Server flavor's RowVersion
            found = tconn.execute(sa.select(cols["headers"], cols["body"]).order_by(seq)).all()
            tx.rollback()
        return [(orjson.loads(h), bytes(body)) for h, body in found]

    lane, per_row = written(True), written(False)
    keys = [int(h["QBridge.Source"].rsplit("/", 1)[1]) for h, _ in lane]
    assert keys == sorted(keys) and len(keys) == 60
    strip = [({k: v for k, v in h.items() if k not in ("traceparent", "NServiceBus.TimeSent")}, body) for h, body in lane]
    assert strip == [({k: v for k, v in h.items() if k not in ("traceparent", "NServiceBus.TimeSent")}, body)
                     for h, body in per_row]
    assert [h.get("traceparent") for h, _ in lane] == [h.get("traceparent") for h, _ in per_row]
    assert all(tracing.valid_traceparent(h["traceparent"]) for h, _ in lane)
    assert {h["traceparent"] for h, _ in lane} == {parent, shapes[4].split("=", 1)[1]}


# -- f000060: imports in the read-ahead's thread --------------------------------------------------

_SPY = IMPORT_SPY + """from bridge.commands.main import main
rc = main(['sync', '--once', '-c', sys.argv[1]])
print('AHEAD', sorted(n for n, t in first.items() if t.startswith('qbridge-read-ahead')))
sys.exit(rc)
"""


def test_a_read_ahead_thread_imports_the_lane_modules_first_when_the_first_batch_was_known(make) -> None:
    """FAILED (latent, fixed; no failing interleaving found within one job). f000060 has the pass's thread
    import pyarrow, pyarrow.compute and ADBC before a read-ahead starts, since two threads importing
    a package at once can see it half made. But where a fresh process's first batch is all known (a
    sync after a migration or a rollback: the lane returns before importing anything), the
    read-ahead's thread is the first to import the lane's modules while making the next batch's
    columns: bridge.sources.nginn_lane, bridge.sources.columns, bridge.codecs.compiled (loading
    bodytype_native), numpy.ma, bridge.targets.envelope_columns (bridge.sources.arrow_fetched too,
    on every first read-ahead, beside the pass's own lane importing it through nginn_lane). In one
    job the pass waits for it; in `qbridge run`, another job's pass thread imports the same modules
    (and pyarrow itself) at the same time, which the fix does not cover."""
    b = make(batch_size=400)
    b.insert(b.ready(800))
    assert b.cli("sync", "--once") == 0
    _rewound(b)
    b.insert(b.ready(900, start=801))
    done = subprocess.run([sys.executable, "-c", _SPY, str(b.config)], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert b.count("Orders") == 1700 and len(_ids(b)) == 1700
    line = next(l for l in done.stdout.splitlines() if l.startswith("AHEAD"))
    assert line == "AHEAD []", f"modules a read-ahead's thread imported first: {line}"


_RUN_SPY = IMPORT_SPY + """atexit.register(lambda: print('FIRST', {m: first.get(m) for m in ('pyarrow', 'pyarrow.compute', 'adbc_driver_postgresql.dbapi')}, flush=True))
from bridge.commands.main import main
sys.exit(main(['run', '-c', sys.argv[1]]))
"""


def test_qbridge_run_of_two_jobs_imports_arrow_first_in_a_scheduler_worker(make) -> None:
    """FAILED (the fix was incomplete, fixed; the race itself could not be forced here). f000060 guards
    against two threads importing pyarrow at once by importing it in the thread that starts a
    read-ahead. `qbridge run` runs every job's first tick at once on APScheduler's thread pool:
    with two NGinn jobs, pyarrow, pyarrow.compute and ADBC's driver are first imported by one
    worker thread (its lane or its `_import_arrow`) while the other job's worker runs its own first
    pass, which imports them too: the same two-thread import the commit describes ("cannot import
    name 'BuildInfo' from partially initialized module 'pyarrow.lib'"). Importing them before the
    scheduler starts its threads would close it."""
    b = make(queues=["MQueue1", "MQueue2"], batch_size=400)
    b.insert(b.ready(900))
    b.insert(b.ready(900, queue="MQueue2"), queue="MQueue2")
    out = run_two_jobs(b, _RUN_SPY)
    line = next(l for l in out.splitlines() if l.startswith("FIRST"))
    assert "ThreadPoolExecutor" not in line, f"Arrow first imported by a scheduler worker, beside the other job's: {line}"
