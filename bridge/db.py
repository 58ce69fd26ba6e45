"""Engines, per-dialect fast paths, and turning driver errors into qbridge errors."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.config import mask_url
from bridge.errors import BridgeError, DriverMissing, RetryableError, SetupError

# SQLSTATE classes/codes that mean "the same statement can succeed later".
# 08 connection, 40 serialization/deadlock, 55P03 lock timeout, 57014 statement timeout, 57P0x
# server shutting down, 53100/53200/53300 disk full, out of memory, too many connections, HYT timeouts.
_RETRYABLE_SQLSTATES = ("08", "40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53100", "53200", "53300",
                        "HYT00", "HYT01")
_RETRYABLE_MESSAGES = re.compile(
    r"deadlock|lock wait timeout|lock request time out|could not connect|connection refused|"
    r"try restarting transaction|server closed the connection|terminating connection|connection (is )?closed|"  # InnoDB 1020
    r"can't connect|lost connection|gone away|database is locked|timeout expired|the database system is",
    re.IGNORECASE,
)


_ENGINES: dict[str, sa.Engine] = {}

# What to install when a driver cannot load, by SQLAlchemy driver name.
INSTALL = {
    "mssql+pyodbc": "unixODBC and Microsoft's ODBC Driver 18 for SQL Server (apt-get install unixodbc, then msodbcsql18 "
                    "from Microsoft's package repository)",
    "mysql+pyodbc": "unixODBC and MariaDB Connector/ODBC (apt-get install unixodbc odbc-mariadb)",
    "mariadb+pyodbc": "unixODBC and MariaDB Connector/ODBC (apt-get install unixodbc odbc-mariadb)",
    "postgresql+psycopg": "psycopg with its binary build (pip install 'psycopg[binary]')",
}
# unixODBC's words for a driver that is configured but not installed (SQLSTATE 01000 / IM002).
# What waiting cannot fix, although a driver raises most of it as the OperationalError of a
# database that is down: a database, role, schema or table that does not exist, a login refused,
# a privilege missing. SQLSTATE where the driver gives one (invalid authorization 28xxx, invalid
# catalog 3D000, invalid schema 3F000, undefined table 42P01 / 42S02, insufficient privilege
# 42501); psycopg gives none for a refused connection, and SQLite never does: their words then.
# Not SQLite's "unable to open database file": it says so too for a journal it cannot open while
# the process is out of file descriptors for a moment, which passes.
_FATAL_SQLSTATES = ("28", "3D000", "3F000", "42P01", "42S02", "42501")
_FATAL_MESSAGES = re.compile(
    r'(database|role|relation|schema) "[^"]*" does not exist|password authentication failed|no pg_hba\.conf entry|'
    r"permission denied|unknown database|access denied for user|login failed|no such table|no such column",
    re.IGNORECASE,
)
# MariaDB's 1305, SQL Server's 3903 and 6401, by number too: their words come in the server's language.
_SAVEPOINT_GONE = re.compile(r"\((?:1305|3903|6401)\)|savepoint \S+ does not exist|no corresponding begin transaction|"
                            r"no transaction or savepoint of that name", re.IGNORECASE)
_DRIVER_NOT_FOUND = re.compile(r"can't open lib|data source name not found|driver.*not (found|installed)", re.IGNORECASE)


def install_hint(url: str | sa.engine.URL) -> str:
    parsed = sa.engine.make_url(url)
    return INSTALL.get(parsed.drivername, f"the Python package of the {parsed.drivername!r} driver")


def dialect_for(url: str) -> sa.Dialect:
    """The URL's SQL dialect without importing its driver: enough to compile statements (DDL for
    a DBA, SQL Server checks) on a machine that has no ODBC library."""
    return sa.engine.make_url(url).get_dialect()()


def engine_for(url: str) -> sa.Engine:
    """One engine per URL per process, with the bulk options of its driver."""
    if url in _ENGINES:
        return _ENGINES[url]
    try:
        return _create(url)
    except ImportError as e:
        raise DriverMissing(f"{mask_url(url)}: its driver cannot load ({e}); install {install_hint(url)}") from None


def _create(url: str) -> sa.Engine:
    parsed = sa.engine.make_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.drivername == "mssql+pyodbc":
        # pyodbc's array binding: one round trip per batch instead of one per row.
        kwargs["fast_executemany"] = True
    if parsed.get_backend_name() == "sqlite":
        kwargs.pop("pool_pre_ping")
        kwargs["connect_args"] = {"timeout": 30}
    if parsed.get_backend_name() in ("postgresql", "mysql", "mariadb"):
        kwargs["pool_size"] = 3
    if parsed.drivername == "postgresql+psycopg":
        # psycopg prepares a statement after 5 runs, and PostgreSQL may then keep a generic
        # plan made while the ledger was nearly empty: a sequential scan per batch at 1M rows.
        kwargs["connect_args"] = {"prepare_threshold": None}
    engine = _ENGINES[url] = sa.create_engine(url, **kwargs)
    if parsed.get_backend_name() == "sqlite":
        _sqlite_immediate(engine)
    if parsed.drivername == "postgresql+psycopg":
        _lz4_unless_chosen(engine)
    return engine


# PostgreSQL compresses a value of more than ~2 kB as it stores it (a BizTalk message's context
# headers and body), with pglz unless told otherwise: half of the COPY of a BizTalk batch. lz4
# (PostgreSQL 14 on, where the server was built with it) takes less than half that time and
# readers decompress either without knowing. Set only where nobody chose a method: the setting's
# source is its default (not the server's file, the database, the role or the connection's options).
_LZ4_UNLESS_CHOSEN = ("SELECT set_config('default_toast_compression', 'lz4', false) FROM pg_settings "
                      "WHERE name = 'default_toast_compression' AND source = 'default' AND 'lz4' = ANY(enumvals)")


def _lz4_unless_chosen(engine: sa.Engine) -> None:
    import psycopg

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        try:
            with dbapi_connection.cursor() as cur:
                cur.execute(_LZ4_UNLESS_CHOSEN)
            dbapi_connection.commit()  # a session setting made in a transaction lasts only if it commits
        except psycopg.Error as e:  # a server that speaks PostgreSQL's protocol but has no such setting: pglz it is
            with suppress(psycopg.Error):  # a connection lost meanwhile: its own error comes with its next use
                dbapi_connection.rollback()
            logging.getLogger("qbridge.db").debug("default_toast_compression left as it is: %s", e)


def sqlite_file(url: str) -> Path | None:
    """The database file a SQLite URL names, resolved (None: not SQLite, or in memory)."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        return Path(parsed.database).resolve()
    return None


def read_only_engine(url: str, missing_ok: bool = False) -> sa.Engine:
    """An engine of its own for commands that only read (preview, discover): no BEGIN IMMEDIATE
    on SQLite, which would lock the legacy writers out, and read-only transactions on PostgreSQL.
    A SQLite file is opened read-only, so one that is not there is an error, not a new empty file;
    `missing_ok`: an empty database in memory instead (a target `init` has not made yet).
    The caller disposes of it."""
    path = sqlite_file(url)
    if path is not None:
        import sqlite3

        if missing_ok and not path.exists():
            return sa.create_engine("sqlite://")
        return sa.create_engine("sqlite://", creator=lambda: sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True))
    engine = sa.create_engine(url)
    return engine.execution_options(postgresql_readonly=True) if engine.dialect.name == "postgresql" else engine


READ_ONLY = "qbridge_read_only"  # an execution option: see reading()


def _sqlite_immediate(engine: sa.Engine) -> None:
    """Every SQLite transaction takes the write lock up front (BEGIN IMMEDIATE).

    With pysqlite's deferred BEGIN, two processes that both read and then write deadlock on
    the lock upgrade and one gets "database is locked" at once; IMMEDIATE makes them queue.
    """

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")


def reading(engine: sa.Engine) -> sa.Connection:
    """A connection for a reader that writes nothing (a job's books, for the status page, /metrics
    and `qbridge status`). On SQLite its transactions begin DEFERRED: a shared lock at the first
    read and no write lock, so a reader of two files never holds one file's write lock while it
    waits for the other's. The books read the target's ledger, then the source; a job's pass locks
    the source, then the target; with both IMMEDIATE they deadlocked until SQLite's 30 s busy
    timeout gave up on one (CI of 2026-11-29: a batch took 30.07 s, the backlog went missing, and
    the alerts on it flapped). Elsewhere it is an ordinary connection."""
    return engine.connect().execution_options(**{READ_ONLY: True})


def dispose_all() -> None:
    """Forgets pooled connections (after a fork, or in tests)."""
    for engine in _ENGINES.values():
        engine.dispose()
    _ENGINES.clear()


def is_retryable(error: BaseException) -> bool:
    """True for a database that is down or restarting, a deadlock, a lock or statement timeout."""
    if isinstance(error, RetryableError):
        return True
    if (cause := _rolled_back_for(error)) is not None and is_retryable(cause):
        return True
    if driver_not_installed(error) or waiting_cannot_fix(error):  # waiting does not install a driver either
        return False
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
        return True
    if isinstance(error, sa_exc.DBAPIError):
        state = sqlstate(error)
        if state and state.startswith(_RETRYABLE_SQLSTATES):
            return True
        return bool(_RETRYABLE_MESSAGES.search(str(error.orig)))
    return isinstance(error, (ConnectionError, TimeoutError))


def _rolled_back_for(error: BaseException) -> sa_exc.DBAPIError | None:
    """The error a rollback to a savepoint was rolling back for, where that rollback failed because
    the savepoint was gone: a deadlock's victim is rolled back whole by InnoDB (then 1305,
    "SAVEPOINT ... does not exist") and SQL Server (1205, then 3903), so the rollback's own error
    is raised with the deadlock as its context. Not where the rollback failed for a reason of its
    own (a connection cut): that error is judged as it is (tests/review/test_savepoint_retry_review.py)."""
    if not isinstance(error, sa_exc.DBAPIError) or not (error.statement or "").upper().startswith(
            ("ROLLBACK TO SAVEPOINT", "ROLLBACK TRANSACTION")) or not _SAVEPOINT_GONE.search(str(error.orig)):
        return None
    cause = error.__context__
    while cause is not None and not isinstance(cause, sa_exc.DBAPIError):  # the driver's own error of the rollback
        cause = cause.__context__
    return cause if isinstance(cause, sa_exc.DBAPIError) else None


def cause_of(error: Exception) -> Exception:
    """What to tell of `error`: the deadlock, not the failed savepoint rollback it led to (as
    is_retryable judges it: by its cause where that is retryable)."""
    cause = _rolled_back_for(error)
    return cause if cause is not None and is_retryable(cause) else error


def waiting_cannot_fix(error: BaseException) -> bool:
    """A database error that stays until someone changes the database or the config (_FATAL_SQLSTATES)."""
    if (cause := _rolled_back_for(error)) is not None:
        return waiting_cannot_fix(cause)
    if not isinstance(error, sa_exc.DBAPIError):
        return False
    state = sqlstate(error)
    if state and state.startswith(_FATAL_SQLSTATES):
        return True
    return bool(_FATAL_MESSAGES.search(str(error.orig)))


def sqlstate(error: sa_exc.DBAPIError) -> str | None:
    orig = error.orig
    for attr in ("sqlstate", "pgcode"):
        value = getattr(orig, attr, None)
        if isinstance(value, str):
            return value
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], str) and re.fullmatch(r"[0-9A-Z]{5}", args[0]):
        return args[0]  # pyodbc puts the SQLSTATE first
    return None


# Native error codes of a duplicate key, where the SQLSTATE (23000) covers every integrity
# error: MySQL/MariaDB ER_DUP_ENTRY, ER_DUP_ENTRY_WITH_KEY_NAME, ER_DUP_UNKNOWN_IN_INDEX; SQL
# Server 2627 (unique constraint) and 2601 (unique index). pyodbc puts them in its message as "(N)".
_DUPLICATE_NATIVE = (1062, 1586, 1859, 2601, 2627)
_NATIVE_IN_TEXT = re.compile(r"\((\d{3,5})\)")
# SQLite's extended result codes: SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE.
_SQLITE_DUPLICATE = (1555, 2067)


def unique_violation(error: sa_exc.IntegrityError) -> bool:
    """A duplicate key (not a NULL, check or foreign-key violation): another delivery of the
    same message. Told by the driver's error codes, never by the message text, which holds the
    key's value (a key such as `checkout-1` or `null-7`)."""
    orig = error.orig
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code in _SQLITE_DUPLICATE
    state = sqlstate(error)
    if state is not None and state != "23000":
        return state == "23505"  # PostgreSQL's unique_violation
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):  # PyMySQL, pymssql: (native code, message)
        return args[0] in _DUPLICATE_NATIVE
    if state == "23000":  # pyodbc: the native code is the last "(N)" before the driver's call name
        codes = [int(c) for c in _NATIVE_IN_TEXT.findall(str(orig))]
        return bool(codes) and codes[-1] in _DUPLICATE_NATIVE
    return False


def driver_not_installed(error: BaseException) -> bool:
    return bool(_DRIVER_NOT_FOUND.search(str(getattr(error, "orig", None) or error)))


def describe(error: BaseException, name: str, url: str) -> BridgeError:
    """A one-line, password-free error for a failure talking to database `name`."""
    detail = str(getattr(error, "orig", None) or error).strip().splitlines()
    first = detail[0] if detail else type(error).__name__
    text = f"database {name!r} ({mask_url(url)}): {first}"
    if driver_not_installed(error):
        return DriverMissing(f"{text}; install {install_hint(url)}")
    if waiting_cannot_fix(error):
        if re.search(r"\bqbridge_\w+", first) and re.search(r"no such table|does not exist|doesn't exist", first, re.IGNORECASE):
            fix = "run `qbridge init`, which makes qbridge's tables"
        elif re.search(r"permission denied|access denied|privilege", first, re.IGNORECASE):
            fix = f"grant the login of connection {name!r} what it lacks (docs/security.md lists the rights each command needs)"
        else:
            fix = f"fix the database or the connection {name!r} in the config"
        return SetupError(f"{text} ({fix}; waiting cannot fix this, so it is not retried)")
    return RetryableError(text) if is_retryable(error) else BridgeError(text)


def analyze(engine: sa.Engine, table: sa.Table) -> None:
    """Has PostgreSQL sample `table` for its planner again (a fixed sample, ~30,000 rows, however
    big the table). Without statistics (autovacuum off, or not round yet after a bulk load) its
    planner took a lookup of 10,000 ledger keys for a scan of every entry of the queue through
    the (origin, at) index: 0.3 s a chunk at 2M entries, 0.03 s once sampled. Elsewhere nothing:
    InnoDB samples on its own after 10% changed; SQLite's planner needs no sample for a primary key."""
    if engine.dialect.name != "postgresql":
        return
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"ANALYZE {conn.dialect.identifier_preparer.format_table(table)}"))
    except sa.exc.SQLAlchemyError as e:  # not the owner, say: lookups are slower, nothing is wrong
        logging.getLogger("qbridge.db").warning(
            "could not refresh the planner statistics of %s (%s); lookups may be slow until autovacuum does", table.name,
            str(getattr(e, "orig", e)).strip().splitlines()[0])


_BINARY_CURSOR: Any = None


@contextmanager
def binary_rows(conn: sa.Connection) -> Iterator[None]:
    """The statements run inside return psycopg's binary rows on PostgreSQL: a bytea value comes
    as its bytes, where a text row brings it as hex twice its size for the client to parse (a
    BizTalk batch's 1,000 context bags of 3 KB: 18 -> 10 ms, issue 49). The values are the same
    Python objects either way. Elsewhere nothing."""
    global _BINARY_CURSOR
    raw = conn.connection.driver_connection
    if conn.dialect.driver != "psycopg" or raw is None:
        yield
        return
    if _BINARY_CURSOR is None:
        import psycopg

        class BinaryCursor(psycopg.Cursor):  # what Connection.cursor(binary=True) makes
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.format = psycopg.pq.Format.BINARY

        _BINARY_CURSOR = BinaryCursor
    was = raw.cursor_factory
    raw.cursor_factory = _BINARY_CURSOR
    try:
        yield
    finally:
        raw.cursor_factory = was


_RESTORE_COST = sa.text("SELECT set_config('random_page_cost', :was, true)")


@contextmanager
def by_index(conn: sa.Connection) -> Iterator[None]:
    """The statements run inside take a batch's rows by their index on PostgreSQL: its planner
    costs each of a batch's hundreds of probes as a random disk read and, below some millions of
    rows, reads the whole table instead, every batch (a ledger lookup 22 µs a key at 200k
    entries, 3.7 by the key; a BizTalk fetch of 500 entries 6.7 ms, 2.1 by the key: issue 49).
    Local to the transaction (a failed statement takes it away with it); the value in force
    before, a session's or a caller's own, is put back after. Elsewhere nothing."""
    if conn.dialect.name != "postgresql":
        yield
        return
    was = conn.exec_driver_sql("SELECT current_setting('random_page_cost'), "
                               "set_config('random_page_cost', '1.1', true)").scalar_one()
    restore = _RESTORE_COST
    try:
        yield
    except BaseException:
        # A transaction the error left usable (a value the driver could not load) gets the
        # setting back too; one the database aborted takes it away itself.
        with suppress(sa.exc.DBAPIError):
            conn.execute(restore, {"was": was})
        raise
    conn.execute(restore, {"was": was})
