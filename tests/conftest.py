"""Real databases for the tests: PostgreSQL and MariaDB on this machine, SQLite in a temp dir.

A test that needs a server skips when the server is unreachable on a developer's machine and
fails in CI (CI=true), where a missing database is a broken run, not a reason to pass.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.db import dispose_all

PG_URL = os.environ.get("QBRIDGE_TEST_PG_URL", "postgresql+psycopg://127.0.0.1/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _reachable(url: str) -> str | None:
    try:
        engine = sa.create_engine(url)
    except ImportError as e:  # the driver's system library is missing: say what to install
        from bridge.db import install_hint

        return f"its driver cannot load ({e}); install {install_hint(url)}, or run `bash .ci/run`, which installs it"
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "not reachable"
        from bridge.db import driver_not_installed, install_hint

        first = str(e).splitlines()[0]
        if driver_not_installed(e):
            return f"{first}; install {install_hint(url)}, or run `bash .ci/run`, which installs it"
        return first
    finally:
        engine.dispose()


def require(url: str, what: str) -> None:
    problem = _reachable(url)
    if problem:
        message = f"{what} at {url} is not reachable: {problem}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def pg_server() -> str:
    require(PG_URL, "PostgreSQL")
    return PG_URL


def _scratch(server: str, create: str, drop: str) -> Iterator[str]:
    """A uniquely named schema or database on `server`, dropped afterwards."""
    name = f"qb_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(server, pool_pre_ping=True)  # the soak test restarts the server
    with engine.begin() as conn:
        conn.execute(sa.text(create.format(name)))
    try:
        yield name
    finally:
        dispose_all()
        with engine.begin() as conn:
            conn.execute(sa.text(drop.format(name)))
        engine.dispose()


@pytest.fixture()
def pg_schema(pg_server: str) -> Iterator[str]:
    yield from _scratch(pg_server, 'CREATE SCHEMA "{}"', 'DROP SCHEMA "{}" CASCADE')


@pytest.fixture()
def pg_schema2(pg_server: str) -> Iterator[str]:
    """A second scratch schema: the other side of a two-way setup."""
    yield from _scratch(pg_server, 'CREATE SCHEMA "{}"', 'DROP SCHEMA "{}" CASCADE')


# The suite runs on two workers (pytest-xdist); a test that restarts PostgreSQL must not do so
# under another's feet. Every test holds this file shared, one marked restarts_postgres holds
# it alone: it waits for the test running beside it, and the next one waits for it.
RESTART_GUARD = Path(tempfile.gettempdir()) / "qbridge-tests-postgresql-restart.lock"


@pytest.fixture(autouse=True)
def _postgresql_restart_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    alone = request.node.get_closest_marker("restarts_postgres") is not None
    with open(RESTART_GUARD, "a+") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _fresh_engines() -> Iterator[None]:
    yield
    dispose_all()


MARIADB_URL = os.environ.get("QBRIDGE_TEST_MARIADB_URL", "mysql+pyodbc://root:@127.0.0.1:3306/test?driver=MariaDB+Unicode")


@pytest.fixture(scope="session")
def mariadb_server() -> str:
    require(MARIADB_URL, "MariaDB (through pyodbc and MariaDB Connector/ODBC)")
    return MARIADB_URL


@pytest.fixture()
def mariadb_database(mariadb_server: str) -> Iterator[str]:
    """A fresh MariaDB database; yields its URL."""
    for name in _scratch(mariadb_server, "CREATE DATABASE `{}`", "DROP DATABASE `{}`"):
        yield mariadb_server.replace("/test?", f"/{name}?")


def _bridges(build) -> Iterator:
    """A factory of bridges made by `build(**kwargs)`, `init` already run; disposed of afterwards."""
    made: list = []

    def factory(**kwargs: object):
        b = build(**kwargs)
        assert b.cli("init") == 0
        made.append(b)
        return b

    yield factory
    for b in made:
        b.dispose()


@pytest.fixture()
def make(pg_server: str, pg_schema: str, tmp_path: Path) -> Iterator:
    """Builds PostgreSQL-to-PostgreSQL bridges in the test's scratch schema, `init` already run."""
    from helpers import Bridge

    yield from _bridges(lambda **kw: Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, **kw))


@pytest.fixture()
def browser() -> Iterator:
    """Debian's headless Chromium driven by Selenium through Debian's chromedriver."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        chromium = None
        missing = f"selenium ({e}); pip install -e '.[dev]'"
    else:
        missing = "chromium and chromium-driver (apt-get install chromium chromium-driver), or run `bash .ci/run`"
    if not (chromium and driver_path):
        message = f"the status page test needs {missing}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(params=["postgres", "sqlite"])
def on_each_db(request, tmp_path: Path) -> Iterator:
    """Builds a bridge on PostgreSQL (a scratch schema) or on SQLite files, `init` already run."""
    from helpers import Bridge

    if request.param == "postgres":
        yield request.getfixturevalue("make")
        return
    yield from _bridges(lambda **kw: Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db", **kw))
