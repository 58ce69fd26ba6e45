"""Review of 37987d9 (a failed rollback to a savepoint is judged by what it rolled back for).

The rule assumes the rollback failed *because of* the error it rolled back for (a deadlock whose
victim the server rolled back whole, then 1305 / 3903). A rollback to a savepoint can also fail on
its own: the connection is cut (a failover, a server restart, a DBA's KILL / pg_terminate_backend)
between a write the target refused and the ROLLBACK TO SAVEPOINT that follows. That error is a
lost connection (SQLSTATE 08S01 / 57P01, connection invalidated), which a retry fixes and which was
retried before the commit; it is now judged by the refusal in its context (a DataError: "Data too
long"), so it is not retried: with_backoff raises it (`sync --once` and migrate's closing drain
fail), and `qbridge run` logs it as an "unexpected DataError", its retries counted under DataError.

Every target write runs under such a savepoint (pipeline/batch.py `_deliver`, pipeline/refusals.py
`write_refusing`), and the refusal path is exactly a DataError inside one, so any batch holding a
row the target refuses opens this window."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from bridge.db import is_retryable
from bridge.pipeline.refusals import write_refusing
from bridge.retry import with_backoff


def _cut_after_refusal(url: str, table: str, own_id: str, cut: Callable[[int], str]) -> tuple[Callable[[], str], list]:
    """`work` for with_backoff: its first attempt writes a value the target refuses (too long) under
    write_refusing's savepoint, and the connection is cut before the savepoint's rollback; its
    second attempt succeeds."""
    engine = sa.create_engine(url)
    tries: list[BaseException | None] = []

    def work() -> str:
        with engine.connect() as killer, engine.connect() as conn, conn.begin():
            if tries:
                tries.append(None)
                return "done"
            me = conn.execute(sa.text(own_id)).scalar()

            def write(c: sa.Connection, outs: list) -> None:
                try:
                    c.execute(sa.text(f"insert into {table} (v) values (:v)"), [{"v": o} for o in outs])
                except sa.exc.DataError:
                    with killer.begin():
                        killer.execute(sa.text(cut(me)))
                    time.sleep(0.5)
                    raise

            try:
                write_refusing(conn, write, ["too long for the column"])
            except BaseException as e:
                tries.append(e)
                raise
            raise AssertionError("the refusal was not raised")

    return work, tries


def _check(work: Callable[[], str], tries: list) -> None:
    try:
        assert with_backoff(work, "the batch", sleep=lambda s: None) == "done"
    finally:
        lost = tries[0] if tries else None
        assert isinstance(lost, sa.exc.OperationalError), lost
        assert lost.statement.upper().startswith("ROLLBACK TO SAVEPOINT"), lost.statement
        assert isinstance(lost.__context__.__context__, sa.exc.DataError), lost.__context__.__context__
    assert is_retryable(lost), f"a connection lost during the savepoint's rollback is not retried: {lost}"


@pytest.mark.mariadb
def test_a_connection_lost_while_rolling_back_a_refused_write_is_retried_on_mariadb(mariadb_database: str) -> None:
    engine = sa.create_engine(mariadb_database)
    with engine.begin() as conn:
        conn.execute(sa.text("create table refusing (v varchar(3)) engine=innodb"))
    engine.dispose()
    work, tries = _cut_after_refusal(mariadb_database, "refusing", "select connection_id()",
                                     lambda me: f"kill connection {me}")
    _check(work, tries)


@pytest.mark.postgres
def test_a_connection_lost_while_rolling_back_a_refused_write_is_retried_on_postgres(pg_server: str, pg_schema: str) -> None:
    engine = sa.create_engine(pg_server)
    with engine.begin() as conn:
        conn.execute(sa.text(f'create table "{pg_schema}".refusing (v varchar(3))'))
    engine.dispose()
    work, tries = _cut_after_refusal(pg_server, f'"{pg_schema}".refusing', "select pg_backend_pid()",
                                     lambda me: f"select pg_terminate_backend({me})")
    _check(work, tries)


def test_a_lost_connection_of_a_savepoint_rollback_is_retryable_whatever_it_rolled_back_for() -> None:
    """The same, in the shape the drivers raise it (no database needed)."""
    refused = sa.exc.DataError("INSERT INTO qbridge_quarantine ...", None, Exception(
        "22001", "[22001] Data too long for column 'reason' at row 1 (1406)"))
    lost = sa.exc.OperationalError("ROLLBACK TO SAVEPOINT sa_savepoint_1", None, Exception(
        "08S01", "[08S01] Lost connection to server during query (2013)"), connection_invalidated=True)
    lost.__context__ = refused
    assert is_retryable(lost)
