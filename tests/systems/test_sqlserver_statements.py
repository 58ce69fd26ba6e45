"""SQL Server has no server here: every statement qbridge runs there is compiled with the mssql
dialect and compared with what NGinn and the NServiceBus transport themselves run."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from bridge.config import load_config
from bridge.db import engine_for
from bridge.errors import DriverMissing
from bridge.ledger.state import State
from bridge.schemas.nservicebus import TargetTables

DIALECT = mssql.dialect()
T = TypeVar("T")


def sql(stmt: sa.ClauseElement) -> str:
    return re.sub(r"\s+", " ", str(stmt.compile(dialect=DIALECT)))


def _with_pyodbc(build: Callable[[], T]) -> T:
    """Runs `build`, which makes mssql+pyodbc engines (engine_for, JobRunner): that imports pyodbc,
    which needs unixODBC's libodbc.so.2, though never a server or a SQL Server driver. Without the
    library the test skips naming the package to install; in CI (CI=true) it fails."""
    from conftest import IN_CI

    try:
        return build()
    except DriverMissing as e:
        cause = e.__context__ if isinstance(e.__context__, ImportError) else e
        message = (f"pyodbc cannot load ({cause}); this test needs only unixODBC's libodbc.so.2, not a SQL Server "
                   "driver: apt-get install unixodbc-dev, or run `bash .ci/run`, which installs it")
        (pytest.fail if IN_CI else pytest.skip)(message)
        raise  # not reached: fail and skip raise


def test_engine_uses_fast_executemany() -> None:
    engine = _with_pyodbc(lambda: engine_for("mssql+pyodbc://u:p@some-dsn"))
    assert engine.dialect.fast_executemany is True


def _nginn_source(tmp: Path, mode: str):
    (tmp / "m.toml").write_text('[routes]\n"*" = "Orders"\n')
    (tmp / "c.toml").write_text(f"""[connections]
legacy = "mssql+pyodbc://u:p@legacy-dsn"
nsb = "mssql+pyodbc://u:p@nsb-dsn"
[[jobs]]
name = "j"
mode = "{mode}"
source = {{ system = "nginn", connection = "legacy", queues = ["MQueue1"], timezone = "UTC", schema = "dbo" }}
target = {{ connection = "nsb", flavor = "sqlserver" }}
mapping = "m.toml"
""")
    from bridge.pipeline.loop import JobRunner

    config = load_config(tmp / "c.toml")
    return _with_pyodbc(lambda: JobRunner(config, config.jobs[0])).sources["MQueue1"]


def test_move_mode_reads_with_nginn_receiver_hints(tmp_path: Path) -> None:
    source = _nginn_source(tmp_path, "move")
    stmt = sql(source._select(lock=True).where(source.table.c.id > 5).limit(100))
    # NGinn's SelectAndLockNext1: `with (UPDLOCK, READPAST)`, ordered; ours adds ROWLOCK
    assert "FROM dbo.[MQueue1] WITH (UPDLOCK, ROWLOCK, READPAST)" in stmt
    assert stmt.startswith("SELECT TOP __[POSTCOMPILE_param_1]") and "ORDER BY dbo.[MQueue1].id" in stmt


def test_copy_mode_reads_past_locked_rows(tmp_path: Path) -> None:
    source = _nginn_source(tmp_path, "copy")
    stmt = sql(source._select(lock=False))
    assert "FROM dbo.[MQueue1] WITH (READPAST)" in stmt and "UPDLOCK" not in stmt


def test_consume_is_nginns_i_to_x_update() -> None:
    from bridge.sources.nginn import CONSUMABLE, queue_table

    t = queue_table("MQueue1", "dbo")
    stmt = sql(sa.update(t).where(t.c.id.in_([1, 2]), t.c.subqueue.in_(CONSUMABLE)).values(subqueue="X", last_processed=sa.bindparam("now")))
    assert stmt.startswith("UPDATE dbo.[MQueue1] SET subqueue=:subqueue, last_processed=:now WHERE dbo.[MQueue1].id IN")
    assert "subqueue IN (__[POSTCOMPILE_subqueue_1])" in stmt


def test_queue_insert_matches_the_transport_send() -> None:
    t = TargetTables("sqlserver", "dbo", "mssql", "nsb").queue("Orders")
    stmt = sql(sa.insert(t).values({"Id": sa.bindparam("Id"), "Recoverable": sa.bindparam("R"), "Expires": None, "Headers": "", "Body": b""}))
    assert stmt.startswith("INSERT INTO dbo.[Orders] ([Id], [Recoverable], [Expires], [Headers], [Body]) VALUES")


def test_delayed_insert_has_headers_body_due() -> None:
    t = TargetTables("sqlserver", "dbo", "mssql").delayed("Orders")
    stmt = sql(sa.insert(t).values({"Headers": "", "Body": b"", "Due": sa.bindparam("d")}))
    assert stmt.startswith("INSERT INTO dbo.[Orders.Delayed] ([Headers], [Body], [Due]) VALUES")


def test_checkpoint_lock_and_ledger_lookup() -> None:
    state = State("dbo")
    c = state.checkpoint
    stmt = sql(sa.select(c).where(c.c.job == "j").with_for_update().with_hint(c, "WITH (UPDLOCK, ROWLOCK)", "mssql"))
    assert "FROM dbo.qbridge_checkpoint WITH (UPDLOCK, ROWLOCK)" in stmt


def test_sql_server_addresses() -> None:
    assert TargetTables("sqlserver", "dbo", "mssql", "nsb").address("Sales") == "Sales@[dbo]@[nsb]"
    assert TargetTables("sqlserver", "my]schema", "mssql").address("Sales") == "Sales@[my]]schema]"


def _reverse_config(tmp: Path) -> Path:
    (tmp / "m.toml").write_text('[routes]\n"Billing" = "Billing"\n')
    (tmp / "c.toml").write_text("""[connections]
legacy = "mssql+pyodbc://u:p@legacy-dsn"
nsb = "mssql+pyodbc://u:p@nsb-dsn/shop"
[[jobs]]
name = "back"
source = { system = "nservicebus", connection = "nsb", flavor = "sqlserver", queues = ["Billing"] }
target = { system = "nginn", connection = "legacy", timezone = "UTC", schema = "dbo" }
mapping = "m.toml"
""")
    return tmp / "c.toml"


def _reverse_runner(tmp: Path):
    from bridge.pipeline.loop import JobRunner

    config = load_config(_reverse_config(tmp))
    return _with_pyodbc(lambda: JobRunner(config, config.jobs[0]))


def test_reverse_job_receives_as_the_sql_server_transport(tmp_path: Path) -> None:
    source = _reverse_runner(tmp_path).sources["Billing"]
    stmt = sql(source._locked(source.queue_table, source.seq, 10))
    # ReceiveText: `SELECT TOP(1) * FROM {0} WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion`, then delete
    assert "FROM dbo.[Billing] WITH (UPDLOCK, READPAST, ROWLOCK)" in stmt
    assert stmt.startswith("SELECT TOP __[POSTCOMPILE_param_1]") and stmt.endswith('ORDER BY dbo.[Billing].[RowVersion]')
    delayed = sql(source._locked(source.delayed_table, source.transport.column(source.delayed_table, "Due"), 10))
    assert "FROM dbo.[Billing.Delayed] WITH (UPDLOCK, READPAST, ROWLOCK)" in delayed and delayed.endswith("[Due]")
    delete = sql(sa.delete(source.queue_table).where(source.seq.in_([1, 2])))
    assert delete.startswith("DELETE FROM dbo.[Billing] WHERE dbo.[Billing].[RowVersion] IN")


def test_reverse_job_init_sql_for_sql_server(tmp_path: Path) -> None:
    from bridge.lifecycle import init
    config = load_config(_reverse_config(tmp_path))
    plans = {p.connection: p for p in init.plan(config, config.jobs)}
    assert plans["nsb"].names == ["Billing", "Billing.Delayed", "SubscriptionRouting"]
    assert plans["legacy"].names == ["qbridge_ledger", "qbridge_checkpoint", "qbridge_quarantine", "qbridge_quarantine_audit",
                                     "qbridge_totals", "qbridge_ledger_ranges", "qbridge_givebacks", "qbridge_inflight", "qbridge_jobs",
                                     "qbridge_steering", "qbridge_steering_audit", "qbridge_job_state", "Billing"]
    legacy = "\n".join(init.ddl(plans["legacy"]))
    assert "CREATE TABLE dbo.[Billing] (\n\tid BIGINT NOT NULL IDENTITY" in legacy
    assert "[RowVersion] BIGINT NOT NULL IDENTITY(1,1)" in "\n".join(init.ddl(plans["nsb"]))


def test_ledger_conversion_for_sql_server(tmp_path: Path) -> None:
    """What `init --print-sql` gives a DBA to convert an earlier ledger: the copy holds the old
    ledger locked against writers until the transaction ends, and the swap is sp_rename's."""
    from bridge.lifecycle import init
    from bridge.model import queue_origin

    config = load_config(_reverse_config(tmp_path))
    plan = {p.connection: p for p in init.plan(config, config.jobs)}["legacy"]
    steps = [re.sub(r"\s+", " ", s) for s in init.conversion_sql(plan)]
    assert "CREATE TABLE dbo.qbridge_ledger_new (" in steps[0] and "PRIMARY KEY (origin, source_key)" in steps[0]
    assert steps[1] == "BEGIN TRANSACTION" and steps[-1] == "COMMIT"
    copy = steps[2]
    assert copy.startswith("INSERT INTO dbo.qbridge_ledger_new (origin, source_key, message_id, job, queue, outcome, target, reason, at)")
    assert f"SELECT {queue_origin('nservicebus', 'shop', 'Billing')} AS anon_1" in copy
    assert "FROM dbo.qbridge_ledger WITH (TABLOCKX, HOLDLOCK) WHERE dbo.qbridge_ledger.job = 'back'" in copy
    assert steps[3:-1] == ["EXEC sp_rename N'dbo.qbridge_ledger', N'qbridge_ledger_old'",
                         "EXEC sp_rename N'dbo.qbridge_ledger_new', N'qbridge_ledger'", "DROP TABLE dbo.qbridge_ledger_old"]


def test_the_fence_check_holds_the_epoch_row_shared_to_the_end_of_the_transaction_on_each_server() -> None:
    """bridge.ledger.fence: the check's read must keep the next taker's UPDATE of the epoch waiting until
    the checking transaction ends (a shared lock held to the end), on every server."""
    from sqlalchemy.dialects import mssql, mysql, postgresql

    from bridge.ledger.fence import Fence, jobs_table

    stmt = Fence(jobs_table("dbo"), "orders", 3, "me").statement()
    sql = str(stmt.compile(dialect=mssql.dialect()))
    assert "FROM dbo.qbridge_jobs WITH (HOLDLOCK, ROWLOCK)" in sql and "FOR" not in sql
    assert str(stmt.compile(dialect=postgresql.dialect())).rstrip().endswith("FOR SHARE")
    assert str(stmt.compile(dialect=mysql.dialect())).rstrip().endswith("LOCK IN SHARE MODE")
