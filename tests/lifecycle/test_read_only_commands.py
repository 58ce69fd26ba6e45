"""Commands that only look write nothing, anywhere, and run with a login that can only read
(issue 45, finding 5): `rollback --dry-run`, `preview`, `verify` (and `--deep`), `status`. Since
fencing landed a dry-run rollback took the job's fence and raised its epoch in qbridge_jobs; an
outside check that snapshots every table before and after caught it. Each is run here with a
login granted SELECT alone, on PostgreSQL and MariaDB, and every table of both sides is compared
before and after."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge

COMMANDS = [("rollback", "--job", "job1", "--dry-run"), ("rollback", "--job", "job1", "--dry-run", "--json"),
            ("preview",), ("preview", "--json"), ("verify",), ("verify", "--deep"), ("verify", "--json"),
            ("status",), ("status", "--json"), ("status", "--history")]


def snapshot(engine: sa.Engine, schema: str | None) -> dict[str, list]:
    """Every table's rows, as sorted text: what a command must leave as it was."""
    out = {}
    with engine.connect() as conn:
        for name in sa.inspect(conn).get_table_names(schema=schema):
            t = sa.Table(name, sa.MetaData(), schema=schema, autoload_with=conn)
            out[name] = sorted(repr(tuple(r)) for r in conn.execute(sa.select(t)))
    return out


def moved(b: Bridge) -> None:
    """Messages delivered, some quarantined, the job's fence taken by the passes that moved them."""
    b.insert(b.ready(30))
    b.insert([{**r, "msg_text": "{not json"} for r in b.ready(2, start=100)])
    assert b.cli("sync", "--once") == 0
    assert b.cli("pause", "--job", "job1", "--why", "looking") == 0 and b.cli("resume", "--job", "job1") == 0


def read_only_config(b: Bridge, url: str) -> Path:
    text = b.config.read_text().replace(f'legacy = "{b.source_url}"', f'legacy = "{url}"').replace(
        f'nsb    = "{b.target_url}"', f'nsb    = "{url}"')
    path = b.tmp / "read-only.toml"
    path.write_text(text)
    return path


def run_each(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.commands.main import main

    for command in COMMANDS:
        capsys.readouterr()
        code = main([command[0], "-c", str(config), *command[1:]])
        out = capsys.readouterr()
        assert code == 0, (command, out.out[-2000:], out.err[-2000:])
        if "--json" in command:
            json.loads(out.out)


@pytest.fixture(params=["copy", "move"])
def pg_reader(request: pytest.FixtureRequest, make, pg_server: str, pg_schema: str) -> Iterator[tuple[Bridge, str]]:
    b = make(mode=request.param)
    moved(b)
    role = f"qbridge_ro_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(pg_server)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE ROLE {role} LOGIN'))
        conn.execute(sa.text(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO {role}'))
        conn.execute(sa.text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{pg_schema}" TO {role}'))
    url = sa.engine.make_url(pg_server).set(username=role).render_as_string(hide_password=False)
    yield b, url
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP OWNED BY {role}'))
        conn.execute(sa.text(f'DROP ROLE {role}'))
    admin.dispose()


@pytest.mark.postgres
def test_looking_commands_run_with_a_read_only_login_and_change_nothing_on_postgresql(
        pg_reader: tuple[Bridge, str], capsys: pytest.CaptureFixture[str]) -> None:
    b, url = pg_reader
    before = snapshot(b.target, b.target_schema)
    run_each(read_only_config(b, url), capsys)
    assert snapshot(b.target, b.target_schema) == before


@pytest.mark.postgres
def test_a_dry_run_rollback_changes_nothing_with_the_owners_login(make, capsys: pytest.CaptureFixture[str]) -> None:
    """The epoch in qbridge_jobs included: a dry run takes no lock and no fence."""
    b = make(mode="move")
    moved(b)
    before = snapshot(b.target, b.target_schema)
    run_each(b.config, capsys)
    assert snapshot(b.target, b.target_schema) == before


@pytest.mark.mariadb
@pytest.mark.postgres
def test_looking_commands_run_with_read_only_logins_on_a_mariadb_legacy_side(
        mariadb_database: str, pg_reader: tuple[Bridge, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NGinn on MariaDB (a login granted SELECT on its database), NServiceBus on PostgreSQL (a
    role granted SELECT), in move mode."""
    nsb, pg_url = pg_reader
    pg_schema, legacy = nsb.target_schema, mariadb_database
    (tmp_path / "m").mkdir()
    b = Bridge(tmp_path / "m", legacy, nsb.target_url, target_schema=pg_schema, mode="move", queues=["MariaQ"])
    assert b.cli("init") == 0
    b.insert(b.ready(10, queue="MariaQ"), queue="MariaQ")
    assert b.cli("sync", "--once") == 0
    with sa.create_engine(nsb.target_url).begin() as conn:  # the tables init just made
        conn.execute(sa.text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{pg_schema}" TO {sa.engine.make_url(pg_url).username}'))
    user = f"qro{uuid.uuid4().hex[:8]}"
    database = sa.engine.make_url(legacy).database
    with b.source.begin() as conn:
        for host in ("%", "localhost"):
            conn.execute(sa.text(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY 'pw'"))
            conn.execute(sa.text(f"GRANT SELECT ON `{database}`.* TO '{user}'@'{host}'"))
    try:
        maria_url = sa.engine.make_url(legacy).set(username=user, password="pw").render_as_string(hide_password=False)
        text = b.config.read_text().replace(f'legacy = "{b.source_url}"', f'legacy = "{maria_url}"').replace(
            f'nsb    = "{b.target_url}"', f'nsb    = "{pg_url}"')
        config = b.tmp / "read-only.toml"
        config.write_text(text)
        before = snapshot(b.target, pg_schema), snapshot(b.source, None)
        run_each(config, capsys)
        assert (snapshot(b.target, pg_schema), snapshot(b.source, None)) == before
    finally:
        with b.source.begin() as conn:
            for host in ("%", "localhost"):
                conn.execute(sa.text(f"DROP USER IF EXISTS '{user}'@'{host}'"))
        b.dispose()
