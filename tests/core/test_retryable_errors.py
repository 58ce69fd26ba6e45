"""What a retry can fix: InnoDB's errors that ask for the transaction to be restarted are, whatever
class pyodbc gives them (its MariaDB driver reports them under SQLSTATE HY000)."""

from __future__ import annotations

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
