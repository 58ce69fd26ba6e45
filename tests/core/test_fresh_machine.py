"""What a fresh machine without the Debian packages sees: commands that only compile SQL work
without pyodbc's native library, and a missing driver is one line naming what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Runs the CLI in a Python where `import pyodbc` fails as it does without libodbc.so.2.
NO_PYODBC = """
import builtins, sys
_real = builtins.__import__
def _fake(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and (name == "pyodbc" or name.startswith("pyodbc.")):
        raise ImportError("libodbc.so.2: cannot open shared object file: No such file or directory")
    return _real(name, globals, locals, fromlist, level)
builtins.__import__ = _fake
from bridge.commands.main import main
sys.exit(main(sys.argv[1:]))
"""

CONFIG = """[connections]
legacy = "mssql+pyodbc://u:s3cret@legacy-dsn"
nsb = "mssql+pyodbc://u:s3cret@nsb-dsn"
[[jobs]]
name = "j"
source = { system = "nginn", connection = "legacy", queues = ["MQueue1"], timezone = "UTC" }
target = { connection = "nsb", flavor = "sqlserver" }
mapping = "m.toml"
"""


def _cli(tmp: Path, *args: str, python: str = NO_PYODBC) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", python, *args], capture_output=True, text=True, cwd=tmp, timeout=120)


@pytest.fixture()
def mssql_config(tmp_path: Path) -> Path:
    (tmp_path / "m.toml").write_text('[routes]\n"MQueue1" = "Orders"\n')
    (tmp_path / "c.toml").write_text(CONFIG)
    return tmp_path


def test_print_sql_needs_no_odbc_library(mssql_config: Path) -> None:
    r = _cli(mssql_config, "init", "-c", "c.toml", "--print-sql")
    assert r.returncode == 0, r.stderr
    assert "CREATE TABLE dbo.[Orders]" in r.stdout and "CREATE TABLE dbo.qbridge_ledger" in r.stdout


@pytest.mark.parametrize("command", [["sync", "--once"], ["verify"], ["status"]])
def test_a_missing_odbc_library_is_one_line_naming_what_to_install(mssql_config: Path, command: list[str]) -> None:
    r = _cli(mssql_config, command[0], "-c", "c.toml", *command[1:])
    assert r.returncode == 2, r.stderr
    text = " ".join(r.stderr.split())
    assert text.startswith("qbridge: missing driver:") and "libodbc.so.2" in text
    assert "ODBC Driver 18 for SQL Server" in text and "apt-get install unixodbc" in text
    assert "Traceback" not in r.stderr and "s3cret" not in r.stderr


@pytest.mark.mariadb
def test_a_configured_but_absent_odbc_driver_names_the_package(tmp_path: Path, mariadb_server: str) -> None:
    """unixODBC is there, the driver the URL names is not: exit 2 at once, no retries."""
    (tmp_path / "m.toml").write_text('[routes]\n"MQueue1" = "Orders"\n')
    url = mariadb_server.split("?")[0] + "?driver=No+Such+Driver"
    (tmp_path / "c.toml").write_text(CONFIG.replace("mssql+pyodbc://u:s3cret@legacy-dsn", url)
                                     .replace("mssql+pyodbc://u:s3cret@nsb-dsn", "sqlite:///nsb.db")
                                     .replace('flavor = "sqlserver"', 'flavor = "postgresql"'))
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "--once", "-c", "c.toml"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    text = " ".join(r.stderr.split())
    assert "missing driver" in text and "apt-get install unixodbc odbc-mariadb" in text, text
    assert "attempt" not in text  # not retried: waiting does not install a driver


@pytest.mark.slow
def test_jvm_start_up_chatter_shows_at_debug_only(tmp_path: Path) -> None:
    from helpers import TZ

    import sqlalchemy as sa

    from bridge.demo.samples import create_nginn_queue, nginn_row

    engine = sa.create_engine(f"sqlite:///{tmp_path}/legacy.db")
    t = create_nginn_queue(engine, "MQueue1")
    with engine.begin() as conn:
        from datetime import datetime

        conn.execute(t.insert(), [nginn_row("MQueue1", i, datetime(2026, 1, 1)) for i in range(1, 4)])
    engine.dispose()
    (tmp_path / "m.toml").write_text('[routes]\n"MQueue1" = "Orders"\n')
    (tmp_path / "c.toml").write_text(f"""[connections]
legacy = "sqlite:///{tmp_path}/legacy.db"
nsb = "sqlite:///{tmp_path}/nsb.db"
[[jobs]]
name = "j"
source = {{ system = "nginn", connection = "legacy", queues = ["MQueue1"], timezone = "{TZ}" }}
target = {{ connection = "nsb", flavor = "postgresql" }}
mapping = "m.toml"
""")
    run = [sys.executable, "-m", "bridge"]
    assert subprocess.run([*run, "init", "-c", "c.toml"], cwd=tmp_path, capture_output=True).returncode == 0
    debug = subprocess.run([*run, "--log-level", "DEBUG", "migrate", "-c", "c.toml", "--master", "local[1]"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert debug.returncode == 0, debug.stderr[-2000:]
    assert "Setting default log level" in debug.stderr
