"""Per-queue totals beside the ledger (issue 27): status and metrics read a handful of rows
whatever the ledger holds, and the totals agree with the ledger after passes, Spark units
racing a fold, quarantine replays and discards, and after `init` adds them to an older ledger."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.demo.samples import nginn_row
from helpers import Bridge, unfold_ranges


def ledger_counts(b: Bridge) -> tuple[dict[str, int], dict[str, int]]:
    """(outcome -> n, skip rule -> n of the per-message entries) counted over the whole ledger,
    range bits included: what the totals must say. NGinn's skips are range bits, which keep no rule."""
    runner = b.runner()
    l = runner.state.ledger
    outcomes = b.ledger()
    with runner.target_engine.connect() as conn:
        rules = dict(conn.execute(sa.select(l.c.reason, sa.func.count()).where(l.c.outcome == "skipped")
                                  .group_by(l.c.reason)).all())
    return {o: outcomes.get(o, 0) for o in ("delivered", "skipped", "quarantined")}, rules


def totals(b: Bridge) -> tuple[dict[str, int], dict[str, int], int]:
    """(outcome -> n, skip rule -> n, rows in qbridge_totals) as status and verify read them."""
    return _totals(b)[:3]


def _totals(b: Bridge) -> tuple[dict[str, int], dict[str, int], int, dict[str, int]]:
    """`totals`, and what left an outcome (released from quarantine, withdrawn by a rollback)."""
    runner = b.runner()
    with runner.target_engine.connect() as conn:
        counts = runner.state.counts(conn, "job1", runner.origins.values()).get("MQueue1", {})
        assert counts.pop("pruned", 0) == 0  # nothing is pruned here (tests/lifecycle/test_prune.py)
        left = {k: counts.pop(k, 0) for k in ("released", "withdrawn")}
        rules = runner.state.skip_reasons(conn, "job1", runner.origins.values()).get("MQueue1", {})
        rows = conn.execute(sa.select(sa.func.count()).select_from(runner.state.totals.table)).scalar_one()
    return counts, rules, rows, left


def mixed(b: Bridge, n: int, start: int = 1) -> None:
    """Ready rows, processed ones (skipped by the `processed = "skip"` rule) and malformed ones."""
    now = b.now_local()
    rows = []
    for i in range(start, start + n):
        if i % 7 == 0:
            rows.append(nginn_row("MQueue1", i, now, subqueue="X"))
        elif i % 11 == 0:
            rows.append(nginn_row("MQueue1", i, now, headers="Filter=a=b"))
        else:
            rows.append(nginn_row("MQueue1", i, now))
    b.insert(rows)


@pytest.fixture()
def bridge(on_each_db):
    return on_each_db(batch_size=10)


def test_totals_agree_with_the_ledger_and_stay_a_few_rows(bridge: Bridge, monkeypatch) -> None:
    from bridge.pipeline import passes

    monkeypatch.setattr(passes, "FOLD_EVERY", 4)
    b = bridge
    mixed(b, 200)
    assert b.cli("sync", "--once") == 0  # 20 passes of 10 rows
    counts, rules, rows = totals(b)
    want, _ = ledger_counts(b)
    assert counts == want and want["skipped"] and want["quarantined"]
    assert list(rules.values()) == [want["skipped"]] and "processed" in next(iter(rules))
    assert rows <= 3 * 4 + 3, f"{rows} rows in qbridge_totals after 20 passes"


def test_a_fold_racing_spark_units_loses_and_doubles_no_count(make) -> None:
    """Units insert their counts while a fold deletes the rows it read, by id: a row a unit
    commits meanwhile, whatever its id, is left for the next fold."""
    b = make(batch_size=5)
    mixed(b, 400)
    runner = b.runner()
    ids = sorted(b.subqueues())
    origin = runner.origins["MQueue1"]
    stop = threading.Event()
    errors: list[BaseException] = []

    def unit(lo: int, hi: int) -> None:
        try:
            b.runner().run_range("MQueue1", lo, hi)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def folder() -> None:
        try:
            while not stop.is_set():
                with runner.target_engine.begin() as conn:
                    runner.state.lock_checkpoint(conn, "job1", "MQueue1")
                    runner.state.totals.fold(conn, "job1", "MQueue1", origin)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    runner.check()
    bounds = [ids[0] - 1, ids[99], ids[199], ids[299], ids[-1]]
    units = [threading.Thread(target=unit, args=(lo, hi)) for lo, hi in zip(bounds, bounds[1:])]
    fold = threading.Thread(target=folder)
    fold.start()
    for t in units:
        t.start()
    for t in units:
        t.join(120)
    stop.set()
    fold.join(60)
    assert not errors, errors
    assert totals(b)[0] == ledger_counts(b)[0]
    assert sum(totals(b)[0].values()) == 400


def test_replay_and_discard_move_their_message_between_totals(make) -> None:
    from bridge.lifecycle.quarantine import QuarantineDesk

    b = make()
    now = b.now_local()
    b.insert([nginn_row("MQueue1", 1, now, headers="Filter=a=b"), nginn_row("MQueue1", 2, now, headers="Filter=c=d"),
              nginn_row("MQueue1", 3, now)])
    assert b.cli("sync", "--once") == 0
    assert totals(b)[0] == {"delivered": 1, "skipped": 0, "quarantined": 2}
    runner = b.runner()
    with runner.target_engine.connect() as conn:
        ids = [q["message_id"] for q in runner.state.quarantined(conn, "job1")]
    QuarantineDesk(runner, "ops", "not ours").discard(ids[:1])
    counts, rules, _ = totals(b)
    assert counts == {"delivered": 1, "skipped": 1, "quarantined": 1}
    assert rules == {"discarded by ops: not ours": 1}
    assert _totals(b)[3] == {"released": 1, "withdrawn": 0}  # what left quarantine, for the counters (issue 46)
    # The mapping learns to read the other one: a replay delivers it.
    with b.source.begin() as conn:
        t = b.tables["MQueue1"]
        conn.execute(sa.update(t).where(t.c.msg_headers == "Filter=c=d").values(msg_headers="Filter=c"))
    with runner.target_engine.begin() as conn:
        q = runner.state.quarantine
        conn.execute(sa.update(q).where(q.c.message_id == ids[1]).values(raw=sa.func.replace(q.c.raw, "Filter=c=d", "Filter=c")))
    QuarantineDesk(b.runner(), "ops", None).replay(ids[1:])
    assert totals(b)[0] == ledger_counts(b)[0] == {"delivered": 2, "skipped": 1, "quarantined": 0}
    assert _totals(b)[3] == {"released": 2, "withdrawn": 0}


def _older_ledger(b: Bridge) -> None:
    """Makes the target look like an earlier qbridge's: a ledger with an entry per message, no totals."""
    unfold_ranges(b)
    runner = b.runner()
    runner.state.totals.table.drop(runner.target_engine)


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_init_adds_totals_to_an_older_ledger_and_other_commands_refuse_until_then(kind: str, request, tmp_path: Path,
                                                                                    capsys) -> None:
    if kind == "postgres":
        b = request.getfixturevalue("make")()
    else:
        b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
        assert b.cli("init") == 0
    mixed(b, 60)
    assert b.cli("sync", "--once") == 0
    want = ledger_counts(b)[0]
    _older_ledger(b)
    capsys.readouterr()
    for command in (("status",), ("sync", "--once"), ("verify",)):
        assert b.cli(*command) == 2  # the books need `init` first: waiting cannot fix it
        err = " ".join(capsys.readouterr().err.split())
        assert "no per-queue totals" in err and "qbridge init" in err, err
    assert b.cli("init", "--print-sql") == 0
    assert "qbridge_totals_new" in capsys.readouterr().out
    assert b.cli("init") == 0
    assert "folded the ledger's 55 NGinn entries into ranges" in " ".join((out := capsys.readouterr().out).split())
    assert "counted the ledger's 60 entries into per-queue totals" in " ".join(out.split())
    assert totals(b)[0] == want
    mixed(b, 20, start=61)
    assert b.cli("sync", "--once") == 0
    assert totals(b)[0] == ledger_counts(b)[0]
    assert b.cli("verify") == 0
    assert b.cli("init") == 0  # nothing more to add
    assert totals(b)[0] == ledger_counts(b)[0]


@pytest.mark.mariadb
def test_totals_are_added_on_mariadb_where_reverse_jobs_keep_their_state(mariadb_database: str) -> None:
    from bridge.db import engine_for
    from bridge.ledger.upgrade import add_totals
    from bridge.ledger.state import LedgerEntry, State

    engine = engine_for(mariadb_database)
    state = State(None)
    for t in state.all_tables():
        t.create(engine)
    entries = [LedgerEntry(f"m{i}", str(i), o, None, r) for i, (o, r) in
               enumerate([("delivered", None)] * 5 + [("skipped", "rule a")] * 2 + [("quarantined", "bad")])]
    with engine.begin() as conn:
        state.record(conn, "rev", "Sender", 42, entries, [])
    state.totals.table.drop(engine)
    assert add_totals(engine, None, "legacy") == 8
    with engine.connect() as conn:
        assert state.counts(conn, "rev", [42]) == {"Sender": {"delivered": 5, "skipped": 2, "quarantined": 1, "pruned": 0,
                                                              "released": 0, "withdrawn": 0}}
        assert state.skip_reasons(conn, "rev", [42]) == {"Sender": {"rule a": 2}}
    assert add_totals(engine, None, "legacy") is None


def test_the_totals_upgrade_compiles_for_sql_server(tmp_path: Path) -> None:
    from bridge.lifecycle import init
    from bridge.config import load_config

    (tmp_path / "m.toml").write_text('[routes]\n"MQueue1" = "Orders"\n')
    (tmp_path / "c.toml").write_text('[connections]\nlegacy = "mssql+pyodbc://u:p@legacy-dsn"\nnsb = "mssql+pyodbc://u:p@nsb-dsn"\n'
                                     '[[jobs]]\nname = "j"\nsource = { system = "nginn", connection = "legacy", queues = ["MQueue1"], '
                                     'timezone = "UTC" }\ntarget = { connection = "nsb", flavor = "sqlserver" }\nmapping = "m.toml"\n')
    config = load_config(tmp_path / "c.toml")
    [plan] = [p for p in init.plan(config, config.jobs) if p.has_state]
    sql = "\n".join(init.totals_upgrade_sql(plan))
    assert "CREATE TABLE dbo.qbridge_totals_new" in sql
    assert "INSERT INTO dbo.qbridge_totals_new (origin, job, queue, outcome, reason, n, at) SELECT" in sql
    assert "GROUP BY" in sql and "EXEC sp_rename N'dbo.qbridge_totals_new', N'qbridge_totals'" in sql
    assert "BEGIN TRANSACTION" in sql and sql.rstrip().endswith("COMMIT")


def test_batch_counts_key_skips_by_rule_only() -> None:
    from bridge.ledger.state import LedgerEntry
    from bridge.ledger.totals import batch_counts

    entries = [LedgerEntry("a", "1", "delivered", "Orders"), LedgerEntry("b", "2", "skipped", None, "rule"),
               LedgerEntry("c", "3", "quarantined", None, "why"), LedgerEntry("d", "4", "skipped", None, "rule")]
    assert batch_counts(entries) == Counter({("delivered", None): 1, ("skipped", "rule"): 2, ("quarantined", None): 1})
