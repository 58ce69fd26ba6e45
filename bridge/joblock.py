"""One `qbridge run` per job at a time: a lock the target database holds for a live session.

Session-level named locks (PostgreSQL advisory locks, MariaDB/MySQL GET_LOCK, SQL Server
sp_getapplock with a Session owner) are released by the server when the holder's connection
ends, so a `qbridge run` that dies (even by SIGKILL) frees its jobs at once and a standby takes
them on its next tick; no lease to expire. SQLite has no server: an flock on a file beside the
database does the same, released by the kernel when the process dies.

The lock is for orderly operation, not for correctness: two passes of one job still serialise
on the checkpoint row, and the ledger refuses a second delivery.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

log = logging.getLogger("qbridge.run")
# How this process names itself where others can see it (PostgreSQL's application_name).
IDENTITY = f"qbridge run on {socket.gethostname()} pid {os.getpid()}"


def lock_name(job: str) -> str:
    return f"qbridge.job.{job}"


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for PostgreSQL's advisory locks."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def acquire_statement(dialect: str, name: str) -> tuple[str, dict[str, Any]]:
    """SQL that tries the lock without waiting and returns one row, one column: held or not."""
    if dialect == "postgresql":
        return "SELECT pg_try_advisory_lock(:key)", {"key": advisory_key(name)}
    if dialect in ("mysql", "mariadb"):
        return "SELECT GET_LOCK(:name, 0)", {"name": name[:64]}
    if dialect == "mssql":
        return ("SET NOCOUNT ON; DECLARE @r int; EXEC @r = sp_getapplock @Resource = :name, @LockMode = 'Exclusive', "
                "@LockOwner = 'Session', @LockTimeout = 0; SELECT CASE WHEN @r >= 0 THEN 1 ELSE 0 END"), {"name": name}
    raise ValueError(f"no session lock for {dialect}")


class JobLock:
    """The lock of one job in its target database, kept on a connection of its own."""

    def __init__(self, engine: sa.Engine, job: str) -> None:
        self.engine = engine
        self.name = lock_name(job)
        self._conn: sa.Connection | None = None
        self._file: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None or self._file is not None

    def ensure(self) -> bool:
        """True when this process holds the lock (taking it if free); False when another does.
        A lock whose connection was lost (database restarted) is given up and tried again."""
        if self.engine.dialect.name == "sqlite":
            return self._flock()
        if self._conn is not None:
            try:
                self._conn.exec_driver_sql("SELECT 1").scalar()
                return True
            except sa.exc.DBAPIError:
                log.warning("lock %s: its connection was lost (database restarted?); taking the lock again", self.name)
                self.release()
        conn = self.engine.connect()
        try:
            sql, params = acquire_statement(self.engine.dialect.name, self.name)
            got = conn.execute(sa.text(sql), params).scalar()
            conn.commit()  # the lock is the session's, not the transaction's
        except BaseException:
            conn.invalidate()
            conn.close()
            raise
        if got in (1, True):
            if self.engine.dialect.name == "postgresql":  # so that `holder()` elsewhere can say who
                conn.execute(sa.text("SELECT set_config('application_name', :n, false)"), {"n": IDENTITY[:63]})
                conn.commit()
            self._conn = conn
            return True
        conn.close()
        return False

    def _flock(self) -> bool:
        if self._file is not None:
            return True
        path = Path(self.engine.url.database or "qbridge").resolve()
        f = open(f"{path}.{self.name}.lock", "ab")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        f.write(f"{os.getpid()}\n".encode())
        f.flush()
        self._file = f
        return True

    def holder(self) -> str:
        """Who holds the lock: this process, another one (named where the database can say), or nobody."""
        if self.held:
            return f"this process ({IDENTITY})"
        dialect = self.engine.dialect.name
        try:
            with self.engine.connect() as conn:
                if dialect == "postgresql":
                    key = advisory_key(self.name)
                    row = conn.execute(sa.text(
                        "SELECT a.application_name, a.client_addr, a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                        "AND l.classid::bigint = :hi AND l.objid::bigint = :lo"),
                        {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF}).first()
                    if row is None:
                        return "nobody"
                    return f"{row[0] or 'a session'} (backend pid {row[2]}{f', from {row[1]}' if row[1] else ''})"
                if dialect in ("mysql", "mariadb"):
                    cid = conn.execute(sa.text("SELECT IS_USED_LOCK(:n)"), {"n": self.name[:64]}).scalar()
                    return "nobody" if cid is None else f"another process (connection {cid})"
        except sa.exc.SQLAlchemyError as e:
            return f"unknown: {str(getattr(e, 'orig', e)).splitlines()[0]}"
        return "not this process"

    def release(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            # Closing the session frees the lock; the connection must not go back to the pool
            # still holding it.
            try:
                conn.invalidate()
            finally:
                conn.close()
        if self._file is not None:
            f, self._file = self._file, None
            f.close()
