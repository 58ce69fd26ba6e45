"""Many rows into one table inside the caller's transaction, by the driver's fast path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.codecs.jsonsafe import ascii_text, writable

if TYPE_CHECKING:
    import psycopg


def insert_rows(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """psycopg COPY on PostgreSQL; elsewhere executemany (array-bound on mssql+pyodbc, whose
    engines qbridge creates with fast_executemany)."""
    if not rows:
        return
    if copies(conn):
        names = list(rows[0])
        copy_rows(conn, table, names, [[row[n] for n in names] for row in rows])
    else:
        conn.execute(table.insert(), rows)


def insert_values(conn: sa.Connection, table: sa.Table, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """insert_rows for rows given as values in the order of `names` (no dict per row on COPY's path)."""
    if not rows:
        return
    if copies(conn):
        copy_rows(conn, table, names, rows)
    else:
        conn.execute(table.insert(), [dict(zip(names, row)) for row in rows])


def copies(conn: sa.Connection) -> bool:
    """Whether inserts on `conn` go through COPY (PostgreSQL through psycopg)."""
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def _binary_type(column: sa.Column) -> str | None:
    """The PostgreSQL type psycopg must send a column's values as in a binary COPY."""
    t = column.type
    for kind, name in _BINARY_TYPES:
        if isinstance(t, kind):
            if name == "timestamp" and getattr(t, "timezone", False):
                return "timestamptz"
            return name
    return None


_BINARY_TYPES = (
    (sa.Uuid, "uuid"), (sa.DateTime, "timestamp"), (sa.LargeBinary, "bytea"), (sa.Boolean, "bool"),
    (sa.BigInteger, "int8"), (sa.SmallInteger, "int2"), (sa.Integer, "int4"), (sa.Float, "float8"), (sa.String, "text"),
)


def copy_rows(conn: sa.Connection, table: sa.Table, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """`COPY ... FROM STDIN` on the connection's own transaction; binary when every column's type
    is known (bodies travel as raw bytes instead of hex text, timestamps unparsed)."""
    prep = conn.dialect.identifier_preparer
    types = [_binary_type(table.c[n]) for n in names]
    binary = all(types)
    sql = f"COPY {prep.format_table(table)} ({', '.join(prep.quote(n) for n in names)}) FROM STDIN"
    if binary:
        sql += " (FORMAT BINARY)"

    def send(copy: Any) -> None:
        if binary:
            copy.set_types(types)
        for row in rows:
            copy.write_row(row)

    _copy(conn, sql, send)


def copy_arrow(conn: sa.Connection, table: sa.Table, data: Any) -> None:
    """`COPY ... FROM STDIN (FORMAT BINARY)` of an Arrow table whose columns are named and typed
    for `table` (a uuid as 16 bytes: the binary format sends both alike), encoded by pgpq."""
    import pgpq

    prep = conn.dialect.identifier_preparer
    sql = (f"COPY {prep.format_table(table)} ({', '.join(prep.quote(n) for n in data.column_names)}) "
           "FROM STDIN (FORMAT BINARY)")
    encoder = pgpq.ArrowToPostgresBinaryEncoder(data.schema)

    def send(copy: Any) -> None:
        copy.write(encoder.write_header())
        for batch in data.to_batches():
            copy.write(encoder.write_batch(batch))
        copy.write(encoder.finish())

    _copy(conn, sql, send)


def _copy(conn: sa.Connection, sql: str, send: Any) -> None:
    # DB-API types know no cursor context manager nor COPY; callers reach COPY only on psycopg (copies()).
    raw = cast("psycopg.Connection[Any] | None", conn.connection.dbapi_connection)
    assert raw is not None
    dbapi = conn.dialect.loaded_dbapi
    try:
        with raw.cursor() as cur, cur.copy(sql) as copy:
            send(copy)
    except dbapi.Error as e:
        # COPY bypasses SQLAlchemy's execute; wrap the driver error the way execute would
        # (IntegrityError, OperationalError, ...) so callers see one kind of error everywhere.
        raise sa.exc.DBAPIError.instance(sql, None, e, dbapi.Error) from e


def write_in_any_charset(conn: sa.Connection, write: Callable[[Callable[[str], str]], object], may_refuse: bool) -> None:
    """`write(text)` (inserts or updates) with the texts as they are (`writable`), or, where the
    database's character set refuses one (a reverse job's books in a utf8mb3 or Latin-1 legacy
    database), in ASCII with escapes: a quarantined row, its reasons and its audit rows are kept
    whatever they hold, never a batch or a replay rolled back for them. `may_refuse`: some text
    is not ASCII; only then is the first try under a savepoint. The refusal is the server's (a
    DataError) or, where the connection's client encoding is the database's own (psycopg on a
    LATIN1 PostgreSQL database), the driver's UnicodeEncodeError before anything is sent."""
    if not may_refuse:
        write(writable)
        return
    try:
        with conn.begin_nested():
            write(writable)
    except (sa_exc.DataError, UnicodeEncodeError):
        write(ascii_text)
