"""Review of commit 7bfecf7 (issue 49): the PostgreSQL ledger lookup under
`SET LOCAL random_page_cost = 1.1` ... `TO DEFAULT`, and `bridge.schemas.text_in.among` (OpenJMS's message
ids as one text the server splits).

Failing first (findings):
- `TO DEFAULT` is not "as it was": it puts the server/role/database/URL value in force for the rest
  of the caller's transaction, over a session-level SET or an enclosing SET LOCAL.
- `among` compares as text; on a char(n) column that changes what `=` means: the ids a char(n)
  column gives back (blank-padded) find no row, where the IN list found them all.

Guards (passing): the lookup on an autocommit connection (SET LOCAL a no-op with a WARNING), in a
read-only transaction, in a savepoint that is released or rolled back; a failed lookup leaves
nothing behind once rolled back; `among` gives IN's rows on varchar for trailing blanks, '#',
duplicates, the separator and 1,500 ids.
"""

from __future__ import annotations

from datetime import datetime

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.ledger.ledger_lookup import entries
from bridge.ledger.state import ledger_table
from bridge.schemas.text_in import TEXT_SEPARATOR, among


@pytest.fixture()
def ledger(pg_server: str, pg_schema: str):
    engine = sa.create_engine(pg_server, connect_args={"prepare_threshold": None})
    table = ledger_table(pg_schema, sa.MetaData())
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"origin": 1, "source_key": k, "message_id": "m", "job": "j", "queue": "q",
                                       "outcome": "delivered", "at": datetime(2026, 1, 1)} for k in ("a", "b", "c")])
    try:
        yield engine, table
    finally:
        engine.dispose()


def _cost(conn: sa.Connection) -> str:
    return conn.exec_driver_sql("SHOW random_page_cost").scalar()


# -- findings ------------------------------------------------------------------------------------

def test_the_lookup_gives_back_a_session_random_page_cost_it_found(ledger) -> None:
    """FINDING (low, planner cost only): an operator's session-level value (a pool's connect hook,
    pgbouncer's connect_query) is replaced by the server/role default until the transaction ends,
    for the batch's writes, ledger insert and checkpoint that follow the lookup in it."""
    engine, table = ledger
    with engine.connect() as conn:
        conn.exec_driver_sql("SET random_page_cost = 2")
        conn.commit()
        assert entries(conn, table, 1, ["a", "x"]) == {"a": "delivered"}
        assert _cost(conn) == "2"  # current code: "4", the reset value
        conn.rollback()


def test_the_lookup_gives_back_an_enclosing_set_local(ledger) -> None:
    """FINDING (low): a caller's SET LOCAL in the same transaction is lost to `TO DEFAULT`."""
    engine, table = ledger
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL random_page_cost = 3")
        assert entries(conn, table, 1, ["b"]) == {"b": "delivered"}
        assert _cost(conn) == "3"  # current code: "4"


def test_among_finds_the_ids_a_char_column_gives_back(pg_server: str, pg_schema: str) -> None:
    """FINDING (low: OpenJMS's own scripts make messageId varchar(64), check_schema does not check
    the type): on a char(64) messageId, `messageid = ANY(text[])` compares as text (the column's
    padding dropped, the value's kept) and finds none of the padded ids the column returned; the
    IN list of varchar compared as char and found them. fetch_keys would then return no rows for a
    batch: nothing delivered, and with more than a batch of handles every pass the same empty one."""
    engine = sa.create_engine(pg_server)
    t = sa.Table("among_char", sa.MetaData(), sa.Column("messageid", sa.CHAR(64)), schema=pg_schema)
    try:
        with engine.begin() as conn:
            t.create(conn)
            conn.execute(t.insert(), [{"messageid": f"ID:{i}"} for i in range(5)])
        with engine.connect() as conn:
            ids = sorted(conn.execute(sa.select(t.c.messageid)).scalars())  # blank-padded to 64
            by_in = conn.execute(sa.select(t.c.messageid).where(t.c.messageid.in_(ids))).scalars().all()
            by_among = conn.execute(sa.select(t.c.messageid).where(among(t.c.messageid, ids, "postgresql"))).scalars().all()
            assert len(by_in) == 5
            assert sorted(by_among) == sorted(by_in)  # current code: []
    finally:
        engine.dispose()


# -- guards --------------------------------------------------------------------------------------

def test_the_lookup_on_an_autocommit_connection_answers(ledger) -> None:
    """SET LOCAL outside a transaction block is a WARNING and no-op, not an error."""
    engine, table = ledger
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert entries(conn, table, 1, ["a", "c", "z"]) == {"a": "delivered", "c": "delivered"}
        assert _cost(conn) == "4"


def test_the_lookup_in_a_read_only_transaction_answers(ledger) -> None:
    """preview/verify read through postgresql_readonly engines: SET is allowed there."""
    engine, table = ledger
    with engine.connect().execution_options(postgresql_readonly=True) as conn:
        assert entries(conn, table, 1, ["a"]) == {"a": "delivered"}
        assert _cost(conn) == "4"
        conn.rollback()


@pytest.mark.parametrize("release", [True, False])
def test_the_lookup_in_a_savepoint_leaves_nothing(ledger, release: bool) -> None:
    engine, table = ledger
    with engine.begin() as conn:
        sp = conn.begin_nested()
        assert entries(conn, table, 1, ["a", "b"]) == {"a": "delivered", "b": "delivered"}
        sp.commit() if release else sp.rollback()
        assert _cost(conn) == "4"


def test_a_failed_lookup_leaves_the_setting_to_the_rollback(ledger) -> None:
    """The SELECT fails after SET LOCAL: the transaction is aborted and its rollback (or a retry's
    new transaction) has the default again; the error is the SELECT's, not the restore's."""
    engine, table = ledger
    with engine.connect() as conn:
        conn.exec_driver_sql(f"LOCK TABLE {engine.dialect.identifier_preparer.format_table(table)} IN ACCESS EXCLUSIVE MODE")  # held by this conn: a second one waits
        with engine.connect() as other:
            other.exec_driver_sql("SET LOCAL statement_timeout = 200")
            with pytest.raises(sa_exc.OperationalError) as caught:  # 57014: retryable
                entries(other, table, 1, ["a"])
            assert "statement timeout" in str(caught.value)
            other.rollback()
            assert _cost(other) == "4"
        conn.rollback()


def test_among_gives_the_in_lists_rows_on_varchar(pg_server: str, pg_schema: str) -> None:
    engine = sa.create_engine(pg_server)
    ids = ["ID:1", "ID:1 ", " ID:1", "ID:a#b", "", "ID:ß", "ID:SS", f"x{TEXT_SEPARATOR}y"] + [f"ID:{i:05d}" for i in range(1500)]
    t = sa.Table("among_vc", sa.MetaData(), sa.Column("messageid", sa.String(64)), schema=pg_schema)
    try:
        with engine.begin() as conn:
            t.create(conn)
            conn.execute(t.insert(), [{"messageid": m} for m in ids])
        with engine.connect() as conn:
            for wanted in (ids[:7], ids[:7] + ids[:3], ids[7:], ids[8:], ["ID:1", "ID:1"], ["nosuch", "ID:1 "]):
                old = sorted(conn.execute(sa.select(t.c.messageid).where(t.c.messageid.in_(wanted))).scalars())
                new = sorted(conn.execute(sa.select(t.c.messageid).where(among(t.c.messageid, wanted, "postgresql"))).scalars())
                assert new == old, wanted
    finally:
        engine.dispose()
