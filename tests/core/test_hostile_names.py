"""Names from config files and from legacy rows reach SQL only as validated, quoted identifiers:
hostile ones are refused with a clear error, odd but legal ones work on every database."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.config import load_config
from bridge.errors import ConfigError
from bridge.demo.samples import nginn_row
from bridge.schemas.nservicebus import TargetTables, create_statements
from helpers import Bridge

HOSTILE = [
    "Orders]; DROP TABLE x;--",
    '"; DROP TABLE x; --',
    "Orders'; DROP TABLE x; --",
    "Orders`; DROP TABLE x",
    "back\\slash",
    "new\nline",
    " padded",
    "x" * 200,
    "",
]
ODD_BUT_LEGAL = ["Orders.v2", "My Orders", "Zamówienia", "Ωmega-Queue.Ünï"]


def _write(b: Bridge, **replace: str) -> None:
    text = b.config.read_text()
    for old, new in replace.items():
        text = text.replace(old, new)
    b.config.write_text(text)


@pytest.mark.parametrize("name", HOSTILE, ids=lambda n: repr(n[:24]))
@pytest.mark.parametrize("where", ["queue", "schema", "route", "error_queue", "job"])
def test_hostile_names_in_config_are_refused_naming_the_field(tmp_path: Path, name: str, where: str) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if where == "queue":
        _write(b, **{'queues = ["MQueue1"]': f"queues = [{quoted}]"})
        field = "queue name"
    elif where == "schema":
        _write(b, **{'database = "LegacyDb"': f'database = "LegacyDb", schema = {quoted}'})
        field = "schema"
    elif where == "route":
        (tmp_path / "mapping.toml").write_text(f'[routes]\n"MQueue1" = {quoted}\n')
        field = "route target"
    elif where == "error_queue":
        _write(b, **{'flavor = "postgresql"': f'flavor = "postgresql", error_queue = {quoted}'})
        field = "name"
    else:
        _write(b, **{'name     = "job1"': f"name = {quoted}"})
        field = "job"
    with pytest.raises(ConfigError) as e:
        load_config(b.config)
    assert field in str(e.value) and str(b.config.name) in str(e.value) or "mapping.toml" in str(e.value)
    b.dispose()


def _odd_names_roundtrip(b: Bridge, legacy: str, target: str) -> None:
    b.queues = [legacy]
    b.mapping = f'[routes]\n"{legacy}" = "{target}"\n'
    b.write_config()
    from bridge.demo.samples import create_nginn_queue

    t = create_nginn_queue(b.source, legacy, b.source_schema)
    with b.source.begin() as conn:
        sentinel = sa.Table("x", sa.MetaData(), sa.Column("n", sa.Integer), schema=b.source_schema)
        sentinel.create(conn, checkfirst=True)
        row = nginn_row(legacy, 1, b.now_local(), headers='Tenant=acme|_NG-ReplyTo=sql://db/x"; DROP TABLE x;--')
        row["to_endpoint"] = "sql://db/Orders]; DROP TABLE x;--"
        conn.execute(t.insert(), [row])
    assert b.cli("init") == 0
    assert b.cli("sync", "--once") == 0
    [got] = b.rows(target)
    # Data stays data: the unrouted reply queue travels as an address, quoted as the transport reads it.
    reply = got["headers"]["NServiceBus.ReplyToAddress"]
    assert reply == f'"x""; DROP TABLE x;--"."{b.target_schema or "public"}"', reply
    assert b.cli("verify") == 0
    with b.source.connect() as conn:
        assert sa.inspect(conn).has_table("x", schema=b.source_schema), "the sentinel table was dropped"


@pytest.mark.parametrize("legacy,target", list(zip(ODD_BUT_LEGAL, reversed(ODD_BUT_LEGAL))))
def test_odd_but_legal_names_work_on_sqlite(tmp_path: Path, legacy: str, target: str) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", queues=[])
    _odd_names_roundtrip(b, legacy, target)
    b.dispose()


@pytest.mark.parametrize("legacy,target", list(zip(ODD_BUT_LEGAL, reversed(ODD_BUT_LEGAL))))
def test_odd_but_legal_names_work_on_postgresql(tmp_path: Path, pg_server: str, pg_schema: str, legacy: str, target: str) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, queues=[])
    _odd_names_roundtrip(b, legacy, target)
    b.dispose()


@pytest.mark.parametrize("legacy", ODD_BUT_LEGAL)
def test_odd_but_legal_legacy_names_work_on_mariadb(tmp_path: Path, mariadb_database: str, pg_server: str,
                                                     pg_schema: str, legacy: str) -> None:
    b = Bridge(tmp_path, mariadb_database, pg_server, target_schema=pg_schema, queues=[])
    _odd_names_roundtrip(b, legacy, "Orders")
    b.dispose()


def test_a_name_postgresql_would_truncate_is_refused(tmp_path: Path, pg_server: str, pg_schema: str) -> None:
    long = "Q" * 60  # fits 63 bytes, but not with ".Delayed"
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema,
               mapping=f'[routes]\n"MQueue1" = "{long}"\n')
    assert b.cli("init") == 2  # what the config names cannot be made: a config error, not retried
    wide = "Ż" * 40  # 40 characters, 80 bytes
    b.mapping = f'[routes]\n"MQueue1" = "{wide}"\n'
    b.write_config()
    assert b.cli("init") == 2
    b.dispose()


def test_odd_names_compile_quoted_for_sql_server() -> None:
    from sqlalchemy.dialects import mssql

    tables = TargetTables("sqlserver", "dbo", "mssql", "nsb")
    for name in ODD_BUT_LEGAL:
        ddl = create_statements([tables.queue(name), tables.delayed(name)], mssql.dialect())
        assert any(f"dbo.[{name}]" in s for s in ddl), ddl
        insert = str(tables.queue(name).insert().compile(dialect=mssql.dialect()))
        assert f"dbo.[{name}]" in insert
