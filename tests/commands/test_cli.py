"""The command line as users and other tools drive it: demo, init, errors, JSON shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.commands.main import main
from helpers import Bridge


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_demo_runs_on_a_fresh_directory(tmp_path: Path) -> None:
    r = run("demo", "--dir", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert "verify: balanced" in r.stdout
    assert "quarantined MQueue1" in r.stdout and "more than one '='" in r.stdout
    for chatter in ("Using incubator modules", "Setting default log level", "sc.setLogLevel"):  # the JVM's, at DEBUG only
        assert chatter not in r.stdout + r.stderr
    engine = sa.create_engine(f"sqlite:///{tmp_path}/d/nservicebus.db")
    with engine.connect() as conn:
        # 20 NGinn + 2 OpenJMS + 2 BizTalk, less the one the demo's NServiceBus endpoint took and replied to
        assert conn.execute(sa.text('select count(*) from "Orders"')).scalar_one() == 23
        assert conn.execute(sa.text('select count(*) from "error"')).scalar_one() == 3  # 2 NGinn F rows + 1 suspended
        assert conn.execute(sa.text('select count(*) from "Sales"')).scalar_one() == 0  # the proxy queue was consumed
    engine.dispose()
    assert "reply in NGinn table Sender: subqueue I, correlation_id corr-1" in " ".join(r.stdout.split())
    legacy = sa.create_engine(f"sqlite:///{tmp_path}/d/legacy-nginn.db")
    with legacy.connect() as conn:
        text = conn.execute(sa.text('select msg_text from "Sender" where subqueue = \'I\'')).scalar_one()
    legacy.dispose()
    assert text.startswith('{"$type":"Orders.OrderAccepted, Orders",')
    # Its last line says what to try next, and both work on the demo as printed.
    hint = " ".join(r.stdout.split()[-40:])
    assert f"qbridge preview -c {tmp_path}/d/demo.toml" in hint and "qbridge rollback -c" in hint
    assert run("preview", "-c", str(tmp_path / "d" / "demo.toml")).returncode == 0
    dry = run("rollback", "-c", str(tmp_path / "d" / "demo.toml"), "--job", "nginn-orders", "--dry-run")
    assert dry.returncode == 0 and "would withdraw" in dry.stdout, dry.stderr


def _config(tmp: Path, target_url: str, flavor: str, schema: str = "") -> Path:
    (tmp / "m.toml").write_text('[routes]\n"MQueue1" = "Orders"\n[states]\nprocessed = "audit"\n')
    schema_kv = f', schema = "{schema}"' if schema else ""
    p = tmp / "c.toml"
    p.write_text(f"""[connections]
legacy = "sqlite:///{tmp}/l.db"
nsb = "{target_url}"
[[jobs]]
name = "j"
source = {{ system = "nginn", connection = "legacy", queues = ["MQueue1"], timezone = "UTC" }}
target = {{ connection = "nsb", flavor = "{flavor}"{schema_kv} }}
mapping = "m.toml"
""")
    return p


def test_print_sql_for_sql_server_matches_the_transport(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "mssql+pyodbc://bridge:s3cret@nsb-dsn", "sqlserver")
    assert main(["init", "-c", str(cfg), "--print-sql"]) == 0
    sql = capsys.readouterr().out
    assert "s3cret" not in sql
    for expected in [
        "CREATE TABLE dbo.[Orders]", "[Id] UNIQUEIDENTIFIER NOT NULL", "[CorrelationId] VARCHAR(255) NULL",
        "[Recoverable] BIT NOT NULL", "[Expires] DATETIME NULL", "[Headers] NVARCHAR(max) NOT NULL",
        "[Body] VARBINARY(max) NULL", "[RowVersion] BIGINT NOT NULL IDENTITY(1,1)",
        "CREATE NONCLUSTERED INDEX [Index_RowVersion] ON dbo.[Orders] ([RowVersion])",
        "CREATE NONCLUSTERED INDEX [Index_Expires] ON dbo.[Orders] ([Expires]) INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL",
        "CREATE TABLE dbo.[Orders.Delayed]", "[Due] DATETIME NOT NULL", "CREATE NONCLUSTERED INDEX [Index_Due] ON dbo.[Orders.Delayed] ([Due])",
        "CREATE TABLE dbo.[SubscriptionRouting]", "[QueueAddress] NVARCHAR(200) NOT NULL", "PRIMARY KEY ([Endpoint], [Topic])",
        "CREATE TABLE dbo.audit", "IF OBJECT_ID(N'dbo.[Orders]', N'U') IS NULL", "GO",
    ]:
        assert expected in sql, expected
    assert "CLUSTERED INDEX [Index_RowVersion]" not in sql.replace("NONCLUSTERED", "")


def test_print_sql_for_postgresql_matches_the_transport(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "postgresql+psycopg://bridge:s3cret@nowhere.invalid/nsb", "postgresql")
    assert main(["init", "-c", str(cfg), "--print-sql"]) == 0  # needs no connection
    sql = capsys.readouterr().out
    for expected in [
        'CREATE TABLE IF NOT EXISTS public."Orders"', "id UUID NOT NULL", "expires TIMESTAMP WITHOUT TIME ZONE",
        "headers TEXT NOT NULL", "body BYTEA", "seq SERIAL NOT NULL", "UNIQUE (seq)",
        'CREATE TABLE IF NOT EXISTS public."Orders.Delayed"', "id UUID DEFAULT gen_random_uuid() NOT NULL",
        "due TIMESTAMP WITH TIME ZONE NOT NULL", "WITH (fillfactor = 100)", '"Orders.Delayed_Due"',
        'CREATE TABLE IF NOT EXISTS public."SubscriptionRouting"', "PRIMARY KEY (endpoint, topic)",
    ]:
        assert expected in sql, expected


def test_init_creates_what_is_missing_and_leaves_the_rest(pg_server: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, pg_server, "postgresql", pg_schema)
    engine = sa.create_engine(pg_server)
    with engine.begin() as conn:  # an existing queue with a row in it
        conn.execute(sa.text(f'CREATE TABLE "{pg_schema}"."Orders" (id uuid primary key, expires timestamp, headers text not null, body bytea, seq serial unique)'))
        conn.execute(sa.text(f"INSERT INTO \"{pg_schema}\".\"Orders\" (id, headers) VALUES (gen_random_uuid(), '{{}}')"))
    assert main(["init", "-c", str(cfg)]) == 0
    first = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "1 already existed" in first
    assert main(["init", "-c", str(cfg)]) == 0
    assert "created 0 table(s)" in capsys.readouterr().out
    with engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names(schema=pg_schema))
        assert conn.execute(sa.text(f'select count(*) from "{pg_schema}"."Orders"')).scalar_one() == 1
    engine.dispose()
    assert {"Orders", "Orders.Delayed", "error", "audit", "SubscriptionRouting", "qbridge_ledger", "qbridge_checkpoint", "qbridge_quarantine",
            "qbridge_quarantine_audit"} <= names


def test_a_database_that_is_down_gets_retried_and_a_clear_error(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "postgresql+psycopg://bridge:s3cret@127.0.0.1:1/nsb", "postgresql")
    sa.create_engine(f"sqlite:///{tmp_path}/l.db").connect().close()
    from bridge.demo.samples import create_nginn_queue

    create_nginn_queue(sa.create_engine(f"sqlite:///{tmp_path}/l.db"), "MQueue1")
    r = run("sync", "-c", str(cfg), "--once", "--retries", "2")
    assert r.returncode == 1
    assert "s3cret" not in r.stderr and "Traceback" not in r.stderr
    assert "attempt 1 of 2, retrying" in r.stderr
    assert "database 'nsb' (postgresql+psycopg://bridge:***@127.0.0.1:1/nsb)" in r.stderr


def test_missing_legacy_table_is_named(tmp_path: Path) -> None:
    cfg = _config(tmp_path, f"sqlite:///{tmp_path}/n.db", "postgresql")
    r = run("sync", "-c", str(cfg), "--once")
    assert r.returncode == 2, r.stderr  # waiting cannot make a table: not retried (issue 46.7)
    said = " ".join(r.stderr.split())  # the console folds long lines
    assert "NGinn queue table 'MQueue1' not found" in said and "Traceback" not in said
    assert "database 'legacy'" in said and "retrying" not in said, r.stderr


def test_status_and_verify_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    b.insert(b.ready(3))
    assert b.cli("sync", "--once") == 0
    b.insert(b.ready(2, start=4))
    capsys.readouterr()
    assert b.cli("status", "--json") == 0
    status = json.loads(capsys.readouterr().out)["jobs"][0]
    assert status["job"] == "job1" and status["rows_moved"] == 3 and status["backlog"] == 2
    assert status["quarantined"] == 0 and status["last_run"] and status["lag_seconds"] is not None
    assert b.cli("verify", "--json") == 0
    books = json.loads(capsys.readouterr().out)
    assert books["balanced"] is True
    q = books["jobs"][0]["queues"][0]
    assert (q["source_rows"], q["delivered"], q["backlog"], q["missing"]) == (3, 3, 2, 0)
    b.dispose()


def test_example_config_works_as_it_is(pg_server: str) -> None:
    root = Path(__file__).resolve().parents[2]
    engine = sa.create_engine(pg_server)
    from bridge.demo.samples import create_nginn_queue, nginn_row
    from bridge.sources.nginn import queue_table

    tables = ["MQueue1", "Orders", "Orders.Delayed", "Unrouted", "Unrouted.Delayed", "error", "SubscriptionRouting",
              "qbridge_ledger", "qbridge_checkpoint", "qbridge_quarantine", "qbridge_quarantine_audit", "qbridge_totals",
              "qbridge_ledger_ranges"]

    def clean() -> None:
        with engine.begin() as conn:
            for t in tables:
                conn.execute(sa.text(f'DROP TABLE IF EXISTS public."{t}"'))

    clean()
    try:
        t = create_nginn_queue(engine, "MQueue1")
        from datetime import datetime

        with engine.begin() as conn:
            conn.execute(t.insert(), [nginn_row("MQueue1", i, datetime(2026, 1, 1, 12, 0)) for i in range(5)])
        for args in (["init"], ["sync", "--once"], ["verify"], ["status"]):
            r = run(args[0], "-c", str(root / "config/example.toml"), *args[1:], cwd=root)
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        with engine.connect() as conn:
            assert conn.execute(sa.text('select count(*) from public."Orders"')).scalar_one() == 5
        assert queue_table("MQueue1") is not None
    finally:
        clean()
        engine.dispose()


def test_migrate_then_verify(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", batch_size=100)
    assert b.cli("init") == 0
    b.insert(b.ready(250))
    r = run("migrate", "-c", str(b.config))
    assert r.returncode == 0, r.stderr
    assert "job1/MQueue1" in r.stdout and "250" in r.stdout
    assert b.count("Orders") == 250
    assert run("verify", "-c", str(b.config)).returncode == 0
    b.dispose()
