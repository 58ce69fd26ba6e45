"""`bridge.db.among`: `column IN values` as one text PostgreSQL splits (issue 49), the IN list
elsewhere and for a value that holds the separator; the same rows either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.db import TEXT_SEPARATOR, among

VALUES = ["ID:a-1", "ID:a-2", "ID:b'3", "ID:ü-4", ""]


def _check(url: str, schema: str | None) -> None:
    engine = sa.create_engine(url)
    t = sa.Table("among_t", sa.MetaData(), sa.Column("k", sa.String(64)), schema=schema)
    try:
        with engine.begin() as conn:
            t.create(conn)
            conn.execute(t.insert(), [{"k": v} for v in [*VALUES, "other", f"x{TEXT_SEPARATOR}y"]])
        with engine.connect() as conn:
            dialect = conn.dialect.name
            for wanted in (["ID:a-1", "ID:ü-4", "ID:b'3", "nosuch"], VALUES[:1], [""], ["", "ID:a-2"], [],
                           [f"x{TEXT_SEPARATOR}y", "other"]):
                got = sorted(conn.execute(sa.select(t.c.k).where(among(t.c.k, wanted, dialect))).scalars())
                assert got == sorted(v for v in [*VALUES, "other", f"x{TEXT_SEPARATOR}y"] if v in wanted), (dialect, wanted)
    finally:
        with engine.begin() as conn:
            t.drop(conn, checkfirst=True)
        engine.dispose()


def test_the_same_rows_on_postgresql(pg_server: str, pg_schema: str) -> None:
    _check(pg_server, pg_schema)


def test_the_same_rows_on_mariadb(mariadb_database: str) -> None:
    _check(mariadb_database, None)


def test_the_same_rows_on_sqlite(tmp_path: Path) -> None:
    _check(f"sqlite:///{tmp_path}/among.db", None)


@pytest.mark.parametrize("values, split", [(["a", "b", "c"], True), (["a", f"b{TEXT_SEPARATOR}"], False), ([""], False)])
def test_postgresql_gets_one_parameter_unless_a_value_holds_the_separator(values: list[str], split: bool) -> None:
    from sqlalchemy.dialects import postgresql

    t = sa.table("t", sa.column("k", sa.String))
    compiled = sa.select(t.c.k).where(among(t.c.k, values, "postgresql")).compile(dialect=postgresql.dialect())
    assert ("string_to_array" in str(compiled)) == split
    # split: the values as one text (and the separator); else the IN list's values
    params = list(compiled.params.values())
    assert params == ([TEXT_SEPARATOR.join(values), TEXT_SEPARATOR] if split else [values])


def _check_uuids(url: str, schema: str | None) -> None:
    """A uuid column's values given as text: compared as uuid[] on PostgreSQL (uuid = varchar has
    no operator), as the column's own values elsewhere (CHAR(32) without dashes on SQLite). Not on
    MariaDB: SQLAlchemy reads its UUID type back with bytes swapped (a uuid column is BizTalk's, and
    BizTalk's tables are SQL Server's, PostgreSQL's and SQLite's here)."""
    import uuid

    engine = sa.create_engine(url)
    t = sa.Table("among_u", sa.MetaData(), sa.Column("u", sa.Uuid), schema=schema)
    ids = [uuid.UUID(int=i << 64 | i) for i in range(1, 6)]
    try:
        with engine.begin() as conn:
            t.create(conn)
            conn.execute(t.insert(), [{"u": u} for u in ids])
        with engine.connect() as conn:
            dialect = conn.dialect.name
            for wanted in ([ids[0], ids[3]], ids[4:], [uuid.UUID(int=99)], []):
                got = sorted(conn.execute(sa.select(t.c.u).where(among(t.c.u, [str(u) for u in wanted], dialect))).scalars())
                assert got == sorted(u for u in wanted if u in ids), (dialect, wanted)
    finally:
        with engine.begin() as conn:
            t.drop(conn, checkfirst=True)
        engine.dispose()


def test_uuids_as_text_on_postgresql(pg_server: str, pg_schema: str) -> None:
    _check_uuids(pg_server, pg_schema)


def test_uuids_as_text_on_sqlite(tmp_path: Path) -> None:
    _check_uuids(f"sqlite:///{tmp_path}/among.db", None)
