"""What a retry can fix: InnoDB's errors that ask for the transaction to be restarted are, whatever
class pyodbc gives them (its MariaDB driver reports them under SQLSTATE HY000); so is a deadlock
whose transaction the server rolled back under a savepoint, whose rollback then failed."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import sqlalchemy as sa

from bridge.db import is_retryable


def _error(message: str, state: str = "HY000") -> sa.exc.DBAPIError:
    return sa.exc.DBAPIError("UPDATE qbridge_ledger ...", None, Exception(state, message))


def test_innodb_asks_to_restart_the_transaction_and_is_retried() -> None:
    changed = ("[HY000] [ma-3.1.15][10.11.19-MariaDB]Record has changed since last read in table 'qbridge_ledger'; "
               "try restarting transaction (1020)")
    assert is_retryable(_error(changed))
    assert is_retryable(_error("[40001] Deadlock found when trying to get lock; try restarting transaction (1213)", "40001"))
    assert not is_retryable(_error("[HY000] Table 'qbridge_ledger' is read only (1036)"))


@pytest.mark.mariadb
def test_a_deadlock_inside_a_savepoint_is_retried_though_the_savepoint_rollback_fails(mariadb_database: str) -> None:
    """InnoDB rolls a deadlock's victim back whole, savepoints and all: SQLAlchemy's rollback to
    the savepoint the write ran under (every target write runs under one: pipeline/refusals.py)
    then fails with 1305 "SAVEPOINT ... does not exist", a ProgrammingError, and that is what is
    raised, the deadlock only its context. It was not retried: `sync --once` failed on it."""
    engine = sa.create_engine(mariadb_database)
    with engine.begin() as conn:
        conn.execute(sa.text("create table dl (id int primary key, v int) engine=innodb"))
        conn.execute(sa.text("insert into dl values (1, 0), (2, 0)"))
    victim, other = engine.connect(), engine.connect()
    victim.begin()
    other.begin()
    victim.execute(sa.text("update dl set v = 1 where id = 1"))
    other.execute(sa.text("update dl set v = 1 where id = 2"))
    waiting = threading.Thread(target=lambda: _quietly(other, "update dl set v = 2 where id = 1"))
    waiting.start()
    time.sleep(0.5)  # `other` waits on the victim's row
    with pytest.raises(sa.exc.DBAPIError) as raised:
        with victim.begin_nested():
            victim.execute(sa.text("update dl set v = 2 where id = 2"))  # the cycle: one of the two is killed
    waiting.join(60)
    for c in (victim, other):
        c.close()
    engine.dispose()
    if "1305" not in str(raised.value):  # InnoDB chose `other` as its victim: this transaction went on
        pytest.skip("InnoDB killed the other transaction; the savepoint was not lost")
    assert "Deadlock" in str(raised.value.__context__.__context__), raised.value
    assert is_retryable(raised.value)


def _quietly(conn: sa.Connection, statement: str) -> None:
    with contextlib.suppress(sa.exc.DBAPIError):
        conn.execute(sa.text(statement))


def test_a_failed_rollback_to_a_savepoint_is_judged_by_what_it_rolled_back_for() -> None:
    """SQL Server rolls a deadlock victim (1205) back whole too, and its savepoint rollback then
    fails (3903); a failed rollback of a savepoint whose cause was fatal stays fatal."""
    deadlock = _error("[40001] Transaction was deadlocked on lock resources ... Rerun the transaction. (1205)", "40001")
    gone = sa.exc.ProgrammingError("ROLLBACK TRANSACTION sa_savepoint_1", None, Exception(
        "42000", "[42000] The ROLLBACK TRANSACTION request has no corresponding BEGIN TRANSACTION. (3903)"))
    gone.__context__ = deadlock
    assert is_retryable(gone)
    missing = _error('relation "Orders" does not exist', "42P01")
    after_missing = sa.exc.ProgrammingError("ROLLBACK TO SAVEPOINT sa_savepoint_1", None, Exception("42000", "no savepoint"))
    after_missing.__context__ = missing
    assert not is_retryable(after_missing)
    plain = sa.exc.ProgrammingError("SELECT 1", None, Exception("42000", "syntax"))
    plain.__context__ = deadlock  # raised while handling a deadlock, but not a savepoint's rollback
    assert not is_retryable(plain)


def test_the_retry_says_deadlock_not_the_savepoint_it_lost(caplog: pytest.LogCaptureFixture) -> None:
    from bridge.retry import with_backoff

    deadlock = _error("[40001] Transaction was deadlocked on lock resources ... Rerun the transaction. (1205)", "40001")
    gone = sa.exc.ProgrammingError("ROLLBACK TRANSACTION sa_savepoint_1", None, Exception(
        "42000", "[42000] The ROLLBACK TRANSACTION request has no corresponding BEGIN TRANSACTION. (3903)"))
    gone.__context__ = deadlock
    tries = iter([gone, None])

    def work() -> str:
        error = next(tries)
        if error is not None:
            raise error
        return "done"

    with caplog.at_level("WARNING"):
        assert with_backoff(work, "the pass", sleep=lambda s: None) == "done"
    [line] = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert "deadlocked" in line and "ROLLBACK TRANSACTION" not in line, line
