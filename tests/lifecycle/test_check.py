"""`qbridge check` (issue 48): every statement a job runs, run once on the job's own connections in
transactions that are rolled back, through the real command; a failure names the GRANT or the
step that fixes it, and nothing stays behind."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.commands.main import main as cli_main
from helpers import Bridge
from tests.commands.test_secrets_and_privileges import PASSWORD, app_role, grant_runtime  # noqa: F401 - the fixture
from tests.systems.test_biztalk_source import SMALL, bt, fx  # noqa: F401 - the fixture
from tests.systems.test_openjms_source import jms  # noqa: F401 - the fixture
from tests.systems.test_reverse_biztalk import bts  # noqa: F401 - the fixture
from tests.systems.test_reverse_nginn import mariadb_reverse_config, two_way  # noqa: F401 - the fixture
from tests.systems.test_reverse_openjms import jms2  # noqa: F401 - the fixture


def checked(config: Path, *more: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(["check", "-c", str(config), "--json", *more])
    return code, json.loads(out.getvalue())


def failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in report["probes"] if not p["ok"]]


def snapshot(engines_schemas: list[tuple[sa.Engine, str | None]]) -> dict[str, Any]:
    """Every table of the given schemas, with its rows (sorted): what a check must leave as it was."""
    found: dict[str, Any] = {}
    for engine, schema in engines_schemas:
        with engine.connect() as conn:
            for name in sa.inspect(conn).get_table_names(schema=schema):
                t = sa.Table(name, sa.MetaData(), autoload_with=conn, schema=schema)
                found[f"{engine.url.render_as_string(hide_password=True)}/{schema}/{name}"] = sorted(
                    repr(tuple(r)) for r in conn.execute(sa.select(t)))
    return found


def passes(config: Path, *more: str) -> dict[str, Any]:
    code, report = checked(config, *more)
    assert code == 0, [(p["job"], p["what"], p["said"], p["fix"]) for p in failures(report)]
    return report


@pytest.mark.parametrize("mode", ["copy", "move"])
def test_nginn_passes_on_postgresql_and_sqlite_and_leaves_nothing(on_each_db, mode: str) -> None:
    b = on_each_db(mode=mode)
    b.insert(b.ready(3))
    schemas = [(b.source, b.source_schema), (b.target, b.target_schema)]
    before = snapshot(schemas)
    report = passes(b.config)
    whats = {p["what"] for p in report["probes"]}
    assert {"server", "clock", "MQueue1: schema", "MQueue1: batch read", "tables", "job lock", "fence"} <= whats
    assert {"MQueue1: write to Orders", "MQueue1: write to Orders.Delayed", "MQueue1: write to error"} <= whats
    assert ("MQueue1: consume" in whats) == (mode == "move")
    write = next(p for p in report["probes"] if p["what"] == "MQueue1: write to Orders")
    assert "read it back byte for byte" in write["said"], write
    assert snapshot(schemas) == before
    assert b.cli("sync", "--once") == 0 and b.count("Orders") == 3  # no lock left behind: the job runs at once
    # and a check with no message waiting
    with b.source.begin() as conn:
        conn.execute(b.tables["MQueue1"].delete())
    passes(b.config)


def test_openjms_passes_on_postgresql_and_mariadb(jms) -> None:
    jms.queue_message("ID:q-1")
    report = passes(jms.config)
    assert any(p["what"] == "orders: batch read" and "1 row" in p["said"] for p in report["probes"])


def test_biztalk_passes_on_sqlite_and_postgresql(bt) -> None:
    bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
    passes(bt.config)


def test_reverse_and_forward_nginn_on_postgresql_leave_nothing(two_way) -> None:
    tw = two_way()
    schemas = [(tw.engine, tw.legacy_schema), (tw.engine, tw.nsb_schema)]
    before = snapshot(schemas)
    report = passes(tw.config)
    assert {p["job"] for p in report["probes"]} == {"forward", "reverse"} or len({p["job"] for p in report["probes"]}) == 2
    assert snapshot(schemas) == before


def test_reverse_openjms_on_mariadb_in_move_mode(jms2) -> None:
    passes(jms2.config)


def test_reverse_biztalk(bts) -> None:
    passes(bts.config)


@pytest.mark.postgres
@pytest.mark.mariadb
def test_reverse_nginn_on_mariadb(pg_server: str, pg_schema: str, mariadb_database: str, tmp_path: Path) -> None:
    config = mariadb_reverse_config(tmp_path, pg_server, pg_schema, mariadb_database, batch_size=2)
    assert cli_main(["init", "-c", str(config)]) == 0
    passes(config)


def test_a_target_without_its_tables_names_init(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    code, report = checked(b.config)
    assert code == 1
    [tables] = [p for p in failures(report) if p["what"] == "tables"]
    assert "qbridge_ledger" in tables["said"] and tables["fix"] == f"run `qbridge init -c {b.config}` (or `qbridge init --print-sql` for a DBA)"


def as_role_without(b: Bridge, role: str, privilege: str, schema: str, table: str) -> None:
    """The config's connections as `role`, which has docs/security.md's runtime grants but
    `privilege` on `schema`.`table`."""
    grant_runtime(b.source, b.source_schema, role)
    with b.source.begin() as conn:
        conn.execute(sa.text(f'REVOKE {privilege} ON "{schema}"."{table}" FROM {role}'))
    app_url = "postgresql+psycopg://" + role + ":" + PASSWORD + "@127.0.0.1/test"
    b.config.write_text(b.config.read_text().replace(f'"{b.source_url}"', f'"{app_url}"'))


def test_a_login_without_insert_on_a_queue_is_told_the_grant(make, app_role: str) -> None:
    b = make()
    b.insert(b.ready(2))
    as_role_without(b, app_role, "INSERT", b.target_schema, "Orders")
    code, report = checked(b.config)
    assert code == 1
    [failed] = failures(report)
    assert failed["what"] == "MQueue1: write to Orders" and "permission denied" in failed["said"]
    assert failed["fix"] == f'GRANT INSERT ON {b.target_schema}."Orders" TO {app_role};'
    # and with it granted, the check passes; without the endpoint's rights to receive, the probe
    # says it could not read the row back, and passes: receiving is the endpoint's right
    with b.source.begin() as conn:
        conn.execute(sa.text(failed["fix"]))
        conn.execute(sa.text(f'REVOKE UPDATE ON "{b.target_schema}"."Orders" FROM {app_role}'))
    report = passes(b.config)
    write = next(p for p in report["probes"] if p["what"] == "MQueue1: write to Orders")
    assert "could not read it back with this login" in write["said"], write


def test_a_login_without_update_on_a_move_mode_legacy_table_is_told_the_grant(make, app_role: str) -> None:
    b = make(mode="move")
    b.insert(b.ready(2))
    as_role_without(b, app_role, "UPDATE", b.source_schema, "MQueue1")
    code, report = checked(b.config)
    assert code == 1
    failed = {p["what"]: p for p in failures(report)}
    assert set(failed) == {"MQueue1: locking read", "MQueue1: consume"}
    for p in failed.values():
        assert p["fix"] == f'GRANT UPDATE ON {b.source_schema}."MQueue1" TO {app_role};', p


def test_migrate_and_run_check_first_and_move_nothing_when_it_fails(make, app_role: str) -> None:
    b = make()
    b.insert(b.ready(2))
    as_role_without(b, app_role, "INSERT", b.target_schema, "Orders")
    assert b.cli("run", "--check") == 1
    assert b.cli("migrate", "--check") == 1
    assert b.count("Orders") == 0


def test_the_sql_server_statements_check_would_run(make) -> None:
    """Each statement the SQL Server tests compile (tests/systems/test_sqlserver_statements.py) is
    among those `check` runs, compiled for SQL Server in --json: the reads with NGinn's hints, the
    transport's receive, the checkpoint and range locks, the fence, the job lock, the inserts."""
    b = make(mode="move", flavor="sqlserver")
    b.insert(b.ready(2))
    report = passes(b.config)
    mssql = [s for p in report["probes"] for s in p["mssql"]]
    expected = {
        "the locking read": f"FROM {b.source_schema}.[MQueue1] WITH (UPDLOCK, ROWLOCK, READPAST)",
        "the copy read": f"FROM {b.source_schema}.[MQueue1] WITH (READPAST)",
        "the consume": f"UPDATE {b.source_schema}.[MQueue1] SET subqueue=",
        "the queue insert": f"INSERT INTO {b.target_schema}.[Orders] (",
        "the receive": f"FROM {b.target_schema}.[Orders] WITH (UPDLOCK, READPAST, ROWLOCK)",
        "the checkpoint lock": "qbridge_checkpoint WITH (UPDLOCK, ROWLOCK)",
        "the range lock": "qbridge_ledger_ranges WITH (UPDLOCK, ROWLOCK)",
        "the fence": "qbridge_jobs WITH (HOLDLOCK, ROWLOCK)",
        "the job lock": "sp_getapplock",
    }
    missing = {k: v for k, v in expected.items() if not any(v in s for s in mssql)}
    assert not missing, (missing, mssql)


def test_a_broken_config_is_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[connections]\nx = "sqlite:///x.db"\n[[jobs]]\nname = "j"\n')
    assert cli_main(["check", "-c", str(config)]) == 2
