"""`bridge.db.binary_rows`: on PostgreSQL through psycopg the statements inside return binary rows
(a bytea value as its bytes, not as hex to parse, issue 49) with the same Python values as text
rows; the connection's cursor factory is its own again afterwards, an error inside included."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.db import binary_rows

ROWS = [
    {"u": uuid.UUID(int=7), "v": "Zoë №4711", "t": "x" * 3000, "at": datetime(2024, 3, 14, 9, 26, 53, 123456), "n": 2**40,
     "b": bytes(range(256)) * 12, "f": True, "d": Decimal("12.50"), "c": "ab"},
    {"u": None, "v": None, "t": "", "at": None, "n": None, "b": b"", "f": None, "d": None, "c": None},
]


def _table(schema: str | None) -> sa.Table:
    return sa.Table("binrows", sa.MetaData(), sa.Column("u", sa.Uuid), sa.Column("v", sa.String(40)), sa.Column("t", sa.Text),
                    sa.Column("at", sa.DateTime), sa.Column("n", sa.BigInteger), sa.Column("b", sa.LargeBinary),
                    sa.Column("f", sa.Boolean), sa.Column("d", sa.Numeric(10, 2)), sa.Column("c", sa.CHAR(5)), schema=schema)


def _same(url: str, schema: str | None) -> None:
    engine = sa.create_engine(url)
    t = _table(schema)
    with engine.begin() as conn:
        t.create(conn)
        conn.execute(t.insert(), ROWS)
    stmt = sa.select(t).order_by(t.c.n.is_(None))
    with engine.connect() as conn:
        as_text = conn.execute(stmt).all()
        factory = getattr(conn.connection.driver_connection, "cursor_factory", None)
        with binary_rows(conn):
            as_binary = conn.execute(stmt).all()
        assert getattr(conn.connection.driver_connection, "cursor_factory", None) is factory
        with pytest.raises(sa.exc.DBAPIError), binary_rows(conn):
            conn.execute(sa.text("SELECT nosuch FROM nowhere"))
        assert getattr(conn.connection.driver_connection, "cursor_factory", None) is factory
    engine.dispose()
    assert [tuple(r) for r in as_binary] == [tuple(r) for r in as_text]
    assert [[type(v) for v in r] for r in as_binary] == [[type(v) for v in r] for r in as_text]
    assert as_binary[0].b == ROWS[0]["b"] and as_binary[0].c.rstrip() == "ab"


def test_the_same_values_on_postgresql(pg_server: str, pg_schema: str) -> None:
    _same(pg_server, pg_schema)


def test_nothing_changes_on_sqlite(tmp_path: Path) -> None:
    _same(f"sqlite:///{tmp_path}/b.db", None)
