"""Secrets never leave qbridge in output, and every command but `init` runs with a PostgreSQL
role that has no DDL rights (the grants docs/security.md documents)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge

PASSWORD = "Sup3r-s3cret-pw"


@pytest.fixture()
def app_role(pg_server: str) -> Iterator[str]:
    """A login role with a password and no privileges of its own."""
    name = f"qb_app_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(pg_server)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {name} LOGIN PASSWORD '{PASSWORD}'"))
    try:
        yield name
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {name}"))
            conn.execute(sa.text(f"DROP ROLE {name}"))
        engine.dispose()


def qbridge(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", args[0], "-c", str(config), *args[1:]],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)


def grant_runtime(admin: sa.Engine, schema: str, role: str) -> None:
    """docs/security.md's grants for sync/run/verify/status on PostgreSQL (one schema for both sides here)."""
    with admin.begin() as conn:
        for stmt in (
            f'GRANT USAGE ON SCHEMA "{schema}" TO {role}',
            f'GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA "{schema}" TO {role}',  # legacy: read; move mode: update
            f'GRANT INSERT ON ALL TABLES IN SCHEMA "{schema}" TO {role}',  # queue, ledger, quarantine rows
            f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO {role}',  # the queue tables' seq
        ):
            conn.execute(sa.text(stmt))


def test_sync_verify_status_without_ddl_rights_and_never_print_the_password(
        tmp_path: Path, pg_server: str, pg_schema: str, app_role: str) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema)
    assert b.cli("init") == 0  # as the owner: DDL rights
    b.insert(b.ready(20))
    grant_runtime(b.source, pg_schema, app_role)
    app_url = "postgresql+psycopg://" + app_role + ":${QB_TEST_PG_PASSWORD}@127.0.0.1/test"
    b.config.write_text(b.config.read_text().replace(f'"{pg_server}"', f'"{app_url}"'))
    env = {"QB_TEST_PG_PASSWORD": PASSWORD}

    outputs = []
    for args in (("sync", "--once"), ("verify", "--json"), ("status", "--json"), ("verify",), ("status",)):
        r = qbridge(b.config, *args, env=env)
        assert r.returncode == 0, (args, r.stderr)
        outputs.append(r.stdout + r.stderr)
    assert b.count("Orders") == 20

    # Without DDL rights, init says what is wrong; the password is not in what it says.
    with b.source.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{pg_schema}"."Orders.Delayed"'))
    r = qbridge(b.config, "init", env=env)
    assert r.returncode == 2 and "permission denied" in r.stderr, r.stderr  # waiting cannot grant it
    outputs.append(r.stdout + r.stderr)

    # A wrong password and a database that does not exist: errors name the URL, masked.
    for broken in (app_url.replace("/test", "/no_such_db"), app_url.replace("127.0.0.1", "127.0.0.1:1")):
        b.config.write_text(b.config.read_text().replace(app_url, broken))
        r = qbridge(b.config, "sync", "--once", "--retries", "1", env=env)
        assert r.returncode == (2 if "no_such_db" in broken else 1), r.stderr  # a port that refuses may come back
        assert "***" in r.stderr and app_role in r.stderr, r.stderr
        outputs.append(r.stdout + r.stderr)
        b.config.write_text(b.config.read_text().replace(broken, app_url))
    for text in outputs:
        assert PASSWORD not in text
    b.dispose()


def test_a_missing_environment_variable_is_a_config_error_naming_it(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    b.config.write_text(b.config.read_text().replace(f'"sqlite:///{tmp_path}/n.db"', '"postgresql+psycopg://u:${QB_NOT_SET_PW}@h/db"'))
    env = {k: v for k, v in os.environ.items() if k != "QB_NOT_SET_PW"}
    r = subprocess.run([sys.executable, "-m", "bridge", "status", "-c", str(b.config)], capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert "QB_NOT_SET_PW" in r.stderr and "bridge.toml" in r.stderr, r.stderr
    b.dispose()
