"""`qbridge preview` (issue 28): what migrate would do, counted exactly as it then does, with
nothing written anywhere; a role with SELECT rights alone can run it; `--fail-on quarantine`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.commands.main import main as cli
from bridge.demo.run import build
from helpers import Bridge
from tests.commands.test_secrets_and_privileges import PASSWORD, app_role  # noqa: F401 - a fixture


def _preview(config: Path, capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli(["preview", "-c", str(config), "--json", *args])
    return code, {j["job"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}


def _tables(path: Path) -> list[str]:
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        return sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_preview_of_the_demo_writes_nothing_and_migrate_then_does_what_it_said(tmp_path: Path, capsys) -> None:
    config = build(tmp_path)
    legacy = (tmp_path / "legacy-nginn.db").read_bytes()
    code, jobs = _preview(config, capsys)
    assert code == 0
    assert not _tables(tmp_path / "nservicebus.db")  # no table, no checkpoint, nothing
    assert (tmp_path / "legacy-nginn.db").read_bytes() == legacy
    nginn = jobs["nginn-orders"]
    assert "nsb: qbridge_ledger" in nginn["missing_tables"] and "nsb: Orders" in nginn["missing_tables"]
    q = {x["queue"]: x for x in nginn["queues"]}["MQueue1"]
    assert q["rows"] == 26 and q["already"] == 0
    assert set(q["states"]) >= {"ready", "delayed", "failed", "processed", "unreadable"}
    assert sum(r["count"] for r in q["quarantined"].values()) == 2
    assert all(r["examples"] for r in q["quarantined"].values())
    assert any("Filter=a=b" in reason or "=" in reason for reason in q["quarantined"])
    assert nginn["subscriptions"] and nginn["quarantined"] >= 2
    jms = jobs["openjms-orders"]
    assert jms["unroutable"] == [{"endpoint": "archive-sub", "topic": "prices.eu", "reason": "no route for the subscriber queue"}]

    # Now do it: what sync delivers, skips and quarantines is what preview said.
    assert cli(["init", "-c", str(config)]) == 0
    assert cli(["sync", "--once", "-c", str(config), "--job", "nginn-orders"]) == 0
    engine = sa.create_engine(f"sqlite:///{tmp_path}/nservicebus.db")
    with engine.connect() as conn:
        for table, n in q["tables"].items():
            assert conn.execute(sa.text(f'select count(*) from "{table}"')).scalar_one() >= n
        quarantined = conn.execute(sa.text("select count(*) from qbridge_quarantine where queue = 'MQueue1'")).scalar_one()
    engine.dispose()
    assert quarantined == 2
    code, jobs = _preview(config, capsys, "--job", "nginn-orders")
    again = {x["queue"]: x for x in jobs["nginn-orders"]["queues"]}["MQueue1"]
    assert again["already"] == 26 and not again["tables"] and not again["quarantined"]
    assert jobs["nginn-orders"]["missing_tables"] == []


def test_fail_on_quarantine_is_a_gate(tmp_path: Path, capsys) -> None:
    config = build(tmp_path)
    assert cli(["preview", "-c", str(config), "--job", "nginn-orders", "--fail-on", "quarantine"]) == 1
    assert "would quarantine" in capsys.readouterr().out
    assert cli(["preview", "-c", str(config), "--job", "biztalk-orders", "--fail-on", "quarantine"]) == 0


def test_counts_agree_with_sync_on_postgresql(make, capsys) -> None:
    from bridge.demo.samples import nginn_row

    b: Bridge = make(batch_size=7)
    now = b.now_local()
    b.insert([nginn_row("MQueue1", i, now, subqueue={0: "X", 1: "R", 2: "F"}.get(i % 10, "I"),
                        headers="Filter=a=b" if i % 17 == 0 else "") for i in range(1, 101)])
    code, jobs = _preview(b.config, capsys)
    q = jobs["job1"]["queues"][0]
    assert code == 0 and q["rows"] == 100
    assert b.cli("sync", "--once") == 0
    assert q["tables"] == {t: n for t, n in (("Orders", b.count("Orders")), ("Orders.Delayed", b.count("Orders.Delayed")),
                                             ("error", b.count("error"))) if n}
    ledger = b.ledger()
    assert sum(q["skipped"].values()) == ledger["skipped"]
    assert sum(r["count"] for r in q["quarantined"].values()) == ledger["quarantined"]


def test_a_role_with_select_rights_alone_runs_it(tmp_path: Path, pg_server: str, pg_schema: str, app_role: str) -> None:  # noqa: F811
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema)
    assert b.cli("init") == 0
    b.insert(b.ready(30))
    with b.source.begin() as conn:
        conn.execute(sa.text(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO {app_role}'))
        conn.execute(sa.text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{pg_schema}" TO {app_role}'))
    url = "postgresql+psycopg://" + app_role + ":${QB_TEST_PG_PASSWORD}@127.0.0.1/test"
    b.config.write_text(b.config.read_text().replace(f'"{pg_server}"', f'"{url}"'))
    with b.target.connect() as conn:
        before = conn.execute(sa.text(f'select count(*) from "{pg_schema}".qbridge_checkpoint')).scalar_one()
    r = subprocess.run([sys.executable, "-m", "bridge", "preview", "-c", str(b.config), "--json"], capture_output=True,
                       text=True, env={**__import__("os").environ, "QB_TEST_PG_PASSWORD": PASSWORD}, timeout=120)
    assert r.returncode == 0, r.stderr
    [job] = json.loads(r.stdout)["jobs"]
    assert job["queues"][0]["tables"] == {"Orders": 30}
    # The same role cannot sync: it would have to write (so preview really wrote nothing).
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "--once", "-c", str(b.config), "--retries", "1"],
                       capture_output=True, text=True, env={**__import__("os").environ, "QB_TEST_PG_PASSWORD": PASSWORD},
                       timeout=120)
    assert r.returncode == 2 and "permission denied" in r.stderr and "grant the login" in " ".join(r.stderr.split())
    with b.target.connect() as conn:
        assert conn.execute(sa.text(f'select count(*) from "{pg_schema}".qbridge_checkpoint')).scalar_one() == before
    assert b.count("Orders") == 0
    b.dispose()


@pytest.mark.mariadb
def test_openjms_on_mariadb(request, tmp_path: Path, pg_server: str, pg_schema: str, capsys) -> None:
    from tests.systems.test_openjms_source import make_jms

    for j in make_jms("mariadb", request, tmp_path, pg_server, pg_schema):
        j.queue_message("ID:q-1")
        j.queue_message("ID:q-2")
        code, jobs = _preview(j.config, capsys)
        q = {x["queue"]: x for x in jobs["job1"]["queues"]}
        assert code == 0 and q["orders"]["tables"] == {"Orders": 2}
        assert j.cli("sync", "--once") == 0 and j.count("Orders") == 2
        code, jobs = _preview(j.config, capsys)
        assert {x["queue"]: x for x in jobs["job1"]["queues"]}["orders"]["already"] == 2


def test_a_large_queue_read_in_slices_by_processes_counts_what_one_process_counts(on_each_db, capsys,
                                                                                  monkeypatch) -> None:
    """Past PARALLEL_ROWS, a queue of increasing keys is read in slices, a process per usable
    core (as migrate spreads the mapping over Spark's tasks): every count, reason, example key
    and type is what one process reading it whole makes of it, some rows delivered already."""
    import bridge.lifecycle.preview as preview_module
    from bridge.demo.samples import nginn_row

    b: Bridge = on_each_db(batch_size=7)
    now = b.now_local()
    b.insert([nginn_row("MQueue1", i, now, subqueue={0: "X", 1: "R", 2: "F"}.get(i % 10, "I"),
                        headers="Filter=a=b" if i % 17 == 0 else "") for i in range(1, 301)])
    assert b.cli("sync", "--once") == 0
    b.insert([nginn_row("MQueue1", i, now, subqueue={0: "X", 1: "R", 2: "F"}.get(i % 10, "I"),
                        headers="Filter=a=b" if i % 13 == 0 else "") for i in range(301, 701)])
    monkeypatch.setattr(preview_module, "usable_cpus", lambda: 3)
    _, whole = _preview(b.config, capsys)
    monkeypatch.setattr(preview_module, "PARALLEL_ROWS", 10)
    calls = []
    real = preview_module._in_processes
    monkeypatch.setattr(preview_module, "_in_processes", lambda *a: calls.append(a[-1]) or real(*a))
    _, sliced = _preview(b.config, capsys)
    assert [len(s) for s in calls] == [3]
    [q_whole], [q_sliced] = whole["job1"]["queues"], sliced["job1"]["queues"]
    assert q_whole["rows"] == 700 and q_whole["already"] == 300 and q_whole["quarantined"]
    assert q_sliced == q_whole


def test_preview_of_a_sqlite_target_not_made_yet_says_so_and_makes_no_file(tmp_path: Path, capsys) -> None:
    """Issue 35: preview opened a missing SQLite target, which created it, empty. It now reads it
    as empty, says `init` would create the file, and leaves none; a missing legacy file is an error."""
    from helpers import Bridge

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    b.insert(b.ready(3))
    capsys.readouterr()
    assert b.cli("preview") == 0
    out = capsys.readouterr().out
    assert f"nsb: the database file {tmp_path / 'nsb.db'} itself" in out.replace("\n", "")
    assert not (tmp_path / "nsb.db").exists()
    (tmp_path / "legacy.db").rename(tmp_path / "moved.db")
    assert b.cli("preview") == 2  # no target yet: waiting cannot make it
    assert f"connection 'legacy' (legacy of job 'job1'): no SQLite database at {tmp_path / 'legacy.db'}" in capsys.readouterr().err
    assert not (tmp_path / "legacy.db").exists() and not (tmp_path / "nsb.db").exists()
    b.dispose()
