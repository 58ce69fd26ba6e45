"""Review of 37987d9 / 79f4f9a: a failed rollback to a savepoint is deferred to its cause only
where bridge.db._SAVEPOINT_GONE matches the error's English text. A server that speaks another
language (MariaDB's lc_messages, a SQL Server login's default language) says 1305 / 3903 / 6401
in its own words, while the native code pyodbc appends ("(1305)") stays the same: a deadlock
inside a savepoint is then again raised as a ProgrammingError nobody retries."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import sqlalchemy as sa

from bridge.db import is_retryable
from tests.core.test_retryable_errors import _quietly


@pytest.mark.mariadb
def test_a_deadlock_inside_a_savepoint_is_retried_on_a_german_speaking_mariadb(mariadb_database: str) -> None:
    engine = sa.create_engine(mariadb_database)
    with engine.begin() as conn:
        conn.execute(sa.text("create table dl (id int primary key, v int) engine=innodb"))
        conn.execute(sa.text("insert into dl values (1, 0), (2, 0)"))
        conn.execute(sa.text("create table heavy (id int primary key) engine=innodb"))
    victim, other = engine.connect(), engine.connect()
    victim.exec_driver_sql("SET lc_messages = 'de_DE'")
    victim.commit()
    victim.begin()
    other.begin()
    victim.execute(sa.text("update dl set v = 1 where id = 1"))
    other.execute(sa.text("insert into heavy (id) select seq from seq_1_to_200"))  # InnoDB kills the lighter one
    other.execute(sa.text("update dl set v = 1 where id = 2"))
    waiting = threading.Thread(target=lambda: _quietly(other, "update dl set v = 2 where id = 1"))
    waiting.start()
    time.sleep(0.5)
    with pytest.raises(sa.exc.DBAPIError) as raised:
        with victim.begin_nested():
            victim.execute(sa.text("update dl set v = 2 where id = 2"))
    waiting.join(60)
    for c in (victim, other):
        with contextlib.suppress(Exception):
            c.close()
    engine.dispose()
    if "1305" not in str(raised.value):
        pytest.skip(f"the savepoint was not lost: {raised.value}")
    assert raised.value.statement.upper().startswith("ROLLBACK TO SAVEPOINT")
    deadlock = raised.value.__context__.__context__
    assert isinstance(deadlock, sa.exc.DBAPIError) and is_retryable(deadlock), deadlock  # alone, it is retried
    assert is_retryable(raised.value), f"a deadlock inside a savepoint is not retried: {raised.value.orig}"

