"""The range ledger of NGinn's increasing keys (issue 27): a block of 1,024 keys a row, bits per
outcome; two writers never both record a key (block locks, the block's primary key, and a
refusal when a bit is set already); the ledger stays small; init folds an earlier ledger."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.ledger.ranges import AlreadyRecorded, Ranges, _blocks_statement, keys_of, ranges_table
from bridge.demo.samples import nginn_row
from helpers import Bridge, unfold_ranges


@pytest.fixture(params=["postgres", "sqlite"])
def engine(request, tmp_path: Path):
    if request.param == "postgres":
        url = request.getfixturevalue("pg_server")
        schema = request.getfixturevalue("pg_schema")
    else:
        url, schema = f"sqlite:///{tmp_path}/r.db", None
    from bridge.db import engine_for

    e = engine_for(url)
    table = ranges_table(schema, sa.MetaData())
    table.create(e)
    yield e, Ranges(table)
    table.drop(e)


def test_bits_say_each_key_once_across_block_edges(engine) -> None:
    e, r = engine
    marked = [(0, "delivered"), (1023, "skipped"), (1024, "quarantined"), (5000, "delivered"), (2 ** 40 + 7, "skipped")]
    with e.begin() as conn:
        r.mark(conn, 7, marked[:3])
    with e.begin() as conn:
        r.mark(conn, 7, marked[3:])
        r.mark(conn, 8, [(1023, "delivered")])  # another queue's key 1023
    with e.connect() as conn:
        assert r.lookup(conn, 7, [0, 1, 1023, 1024, 1025, 5000, 2 ** 40 + 7]) == dict(marked)
        assert list(r.stream(conn, 7)) == marked
        assert list(r.stream(conn, 8)) == [(1023, "delivered")]


def test_a_key_recorded_already_is_refused_and_nothing_of_the_batch_stays(engine) -> None:
    e, r = engine
    with e.begin() as conn:
        r.mark(conn, 7, [(10, "delivered"), (11, "skipped")])
    with pytest.raises(AlreadyRecorded, match="key 11"):
        with e.begin() as conn:
            r.mark(conn, 7, [(12, "delivered"), (2000, "delivered")])  # a new block, and a new bit
            r.mark(conn, 7, [(11, "delivered")])
    with e.connect() as conn:
        assert list(r.stream(conn, 7)) == [(10, "delivered"), (11, "skipped")]
    with e.begin() as conn:  # init's fold merges: a key with a bit keeps the bit it has
        r.mark(conn, 7, [(11, "delivered"), (12, "delivered")], merge=True)
    with e.connect() as conn:
        assert list(r.stream(conn, 7)) == [(10, "delivered"), (11, "skipped"), (12, "delivered")]


def test_keys_of_a_block_come_out_ascending() -> None:
    assert list(keys_of(3, (1 << 1023) | (1 << 5) | 1)) == [3072, 3077, 4095]


RACER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from helpers import Bridge
    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    config = load_config({config!r})
    runner = JobRunner(config, config.jobs[0])
    runner.check()
    while time.time() < {start}:
        time.sleep(0.001)
    result = runner.run_range("MQueue1", {lo}, {hi})
    print(result.stats.delivered, result.stats.already)
""")


def _race(b: Bridge, lo: int | None, hi: int, racers: int = 2) -> list[tuple[int, int]]:
    import time

    start = time.time() + 3
    procs = [subprocess.Popen([sys.executable, "-c", RACER.format(tests=str(Path(__file__).parents[1]), config=str(b.config),
                                                                   start=start, lo=lo, hi=hi)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(racers)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stderr.decode()[-3000:]
        delivered, already = stdout.split()[-2:]
        out.append((int(delivered), int(already)))
    return out


def _sqlite_bridge(tmp_path: Path, **kwargs) -> Bridge:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", **kwargs)
    assert b.cli("init") == 0
    return b


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_two_processes_racing_over_the_same_keys_record_each_once(kind: str, request, tmp_path: Path) -> None:
    """Two OS processes work through the same ids at once (a Spark task and its speculative
    copy), both optimistic (no lookup first), batches of 100 over blocks they share: every
    message arrives once, the bits say each key once, and the two counts add up."""
    b = request.getfixturevalue("make")(batch_size=100) if kind == "postgres" else _sqlite_bridge(tmp_path, batch_size=100)
    now = b.now_local()
    ids = b.insert([nginn_row("MQueue1", i, now, subqueue="X" if i % 9 == 0 else "I",
                              headers="Filter=a=b" if i % 13 == 0 else "") for i in range(1, 2501)])
    results = _race(b, ids[0] - 1, ids[-1])
    assert sum(d for d, _ in results) == b.count("Orders")
    assert all(d + a for d, a in results)
    counts = b.ledger()
    assert counts["delivered"] == b.count("Orders") and sum(counts.values()) == 2500
    assert len(set(b.message_ids("Orders"))) == b.count("Orders")
    runner = b.runner()
    with runner.target_engine.connect() as conn:
        keys = [k for k, _ in runner.state.recorded_keys(conn, "job1", runner.origins["MQueue1"])]
        blocks = conn.execute(sa.select(sa.func.count()).select_from(runner.state.ranges.table)).scalar_one()
    assert keys == ids
    assert blocks <= len({i >> 10 for i in ids})
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_the_ledger_keeps_blocks_not_messages(make) -> None:
    b = make(batch_size=500)
    now = b.now_local()
    b.insert([nginn_row("MQueue1", i, now, headers="Filter=a=b" if i % 1000 == 0 else "") for i in range(1, 5001)])
    assert b.cli("sync", "--once") == 0
    assert b.ledger() == {"delivered": 4995, "quarantined": 5}
    with b.target.connect() as conn:
        entries = conn.execute(sa.text(f'select count(*) from "{b.target_schema}".qbridge_ledger')).scalar_one()
        blocks = conn.execute(sa.text(f'select count(*) from "{b.target_schema}".qbridge_ledger_ranges')).scalar_one()
    assert entries == 5 and blocks <= 6


@pytest.mark.postgres
def test_a_late_commit_has_no_bit_until_it_is_delivered(make) -> None:
    b = make()
    now = b.now_local()
    t = b.tables["MQueue1"]
    late = b.source.connect()
    tx = late.begin()
    b.insert([nginn_row("MQueue1", 1, now)])
    late_id = b.insert_in(late, [nginn_row("MQueue1", 2, now)])[0]
    b.insert([nginn_row("MQueue1", 3, now)])
    assert b.cli("sync", "--once") == 0
    runner = b.runner()
    origin = runner.origins["MQueue1"]
    with runner.target_engine.connect() as conn:
        assert late_id not in runner.state.ranges.lookup(conn, origin, [late_id])
        assert len(runner.state.ranges.lookup(conn, origin, [late_id - 1, late_id + 1])) == 2
    tx.commit()
    late.close()
    assert b.cli("sync", "--once") == 0
    with runner.target_engine.connect() as conn:
        assert runner.state.ranges.lookup(conn, origin, [late_id]) == {late_id: "delivered"}
    assert b.count("Orders") == 3 and t is not None


@pytest.mark.postgres
def test_a_replayed_message_is_not_delivered_again_by_a_unit_that_trusts_the_bits(make) -> None:
    """A quarantined key has a bit and an entry; the replay changes the entry. A Spark unit's
    first attempt looks nothing up: the bit refuses its batch, which is redone with the lookup."""
    from bridge.lifecycle.quarantine import QuarantineDesk

    b = make(batch_size=10)
    now = b.now_local()
    ids = b.insert([nginn_row("MQueue1", i, now, headers="Filter=a=b" if i == 5 else "") for i in range(1, 21)])
    runner = b.runner()
    runner.check()
    runner.run_range("MQueue1", ids[0] - 1, ids[-1])
    assert b.count("Orders") == 19
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:
        conn.execute(sa.update(t).where(t.c.id == ids[4]).values(msg_headers="Filter=a"))
    with runner.target_engine.begin() as conn:
        [q] = runner.state.quarantined(conn, "job1")
        conn.execute(sa.update(runner.state.quarantine).values(raw=sa.func.replace(runner.state.quarantine.c.raw, "Filter=a=b", "Filter=a")))
    QuarantineDesk(b.runner(), "ops", None).replay([q["message_id"]])
    assert b.count("Orders") == 20
    again = b.runner()
    again.check()
    result = again.run_range("MQueue1", ids[0] - 1, ids[-1])  # a new process: optimistic
    assert (result.stats.delivered, result.stats.already) == (0, 20)
    assert b.count("Orders") == 20 and b.ledger() == {"delivered": 20}
    assert b.cli("verify") == 0


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_init_folds_an_earlier_ledger_resumably_and_commands_refuse_until_then(kind: str, request, tmp_path: Path,
                                                                             capsys, monkeypatch) -> None:
    from bridge.ledger import ranges_upgrade
    b = request.getfixturevalue("make")(batch_size=50) if kind == "postgres" else _sqlite_bridge(tmp_path, batch_size=50)
    now = b.now_local()
    b.insert([nginn_row("MQueue1", i, now, subqueue="X" if i % 9 == 0 else "I",
                        headers="Filter=a=b" if i % 13 == 0 else "") for i in range(1, 3001)])
    assert b.cli("sync", "--once") == 0
    want = b.ledger()
    assert unfold_ranges(b) == 3000 - want["quarantined"]
    capsys.readouterr()
    for command in (("status",), ("sync", "--once"), ("verify",), ("migrate",)):
        assert b.cli(*command) == 2  # the books need `init` first: waiting cannot fix it
        err = " ".join(capsys.readouterr().err.split())
        assert "fold them into ranges" in err and "qbridge init" in err, err
    assert b.cli("init", "--print-sql") == 0
    assert "qbridge_ledger_ranges_new" in capsys.readouterr().out
    # A fold cut off after its first chunk of entries resumes on the next init (its first
    # transaction gives the quarantined entries their bits, its second folds 1,000 entries).
    monkeypatch.setattr(ranges_upgrade, "CHUNK", 1000)
    calls = {"n": 0}
    real = ranges_upgrade.Ranges.mark

    def cut(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("cut off")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ranges_upgrade.Ranges, "mark", cut)
    assert b.cli("init") != 0  # qbridge's main says it was interrupted
    assert b.cli("status") == 2  # still refused: the fold is not finished
    monkeypatch.setattr(ranges_upgrade.Ranges, "mark", real)
    capsys.readouterr()
    assert b.cli("init") == 0
    assert f"folded the ledger's {3000 - want['quarantined'] - 1000:,} NGinn entries" in " ".join(capsys.readouterr().out.split())
    assert b.ledger() == want
    with b.target.connect() as conn:
        name = b._qualified("qbridge_ledger")
        assert conn.execute(sa.text(f"select count(*) from {name}")).scalar_one() == want["quarantined"]
    assert b.cli("verify") == 0
    b.insert([nginn_row("MQueue1", i, now) for i in range(3001, 3011)])
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == want["delivered"] + 10
    assert b.cli("init") == 0


def test_the_block_lock_compiles_for_sql_server() -> None:
    from sqlalchemy.dialects import mssql

    t = ranges_table("dbo", sa.MetaData())
    sql = str(_blocks_statement(t, True).compile(dialect=mssql.dialect()))
    assert "FROM dbo.qbridge_ledger_ranges WITH (UPDLOCK, ROWLOCK)" in sql and sql.endswith("ORDER BY dbo.qbridge_ledger_ranges.block")
    ddl = str(sa.schema.CreateTable(t).compile(dialect=mssql.dialect()))
    assert "delivered VARBINARY(128) NOT NULL" in ddl and "PRIMARY KEY (origin, block)" in ddl
