"""One `qbridge run` per job at a time: a lock the target database holds for a live session.

Session-level named locks (PostgreSQL advisory locks, MariaDB/MySQL GET_LOCK, SQL Server
sp_getapplock with a Session owner) are released by the server when the holder's connection
ends, so a `qbridge run` that dies (even by SIGKILL) frees its jobs at once and a standby takes
them on its next tick; no lease to expire. SQLite has no server: an flock on a file beside the
database does the same, released by the kernel when the process dies.

`qbridge run` takes it per job and checks before each batch that it still holds it; `sync` and
`migrate` take it for their whole run, waiting a while for a holder to finish.

A session lock can be lost without its holder noticing (the session ends under a batch under
way), so the lock alone proves nothing at commit time: taking it raises the job's fencing epoch,
which every transaction that writes the job's books checks before it commits (bridge.ledger.fence).
Two passes of one job also serialise on the checkpoint row, pending keys are merged under that
row's lock, and the ledger refuses a second delivery.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

from bridge.errors import JobBusy, LockLost  # noqa: F401 - LockLost is imported from here too
from bridge.ledger import fence

log = logging.getLogger("qbridge.run")
# How this process names itself where others can see it (PostgreSQL's application_name).
def identity(command: str) -> str:
    return f"qbridge {command} on {socket.gethostname()} pid {os.getpid()}"


IDENTITY = identity("run")


def lock_name(job: str, scope: str | None = None) -> str:
    """The lock's name: per job and per place its state lives (two bridges with a job of the same
    name in two schemas or databases of one server are two jobs). At most 64 characters, as
    MySQL/MariaDB's GET_LOCK takes (a longer one is a digest)."""
    name = f"qbridge.job.{scope}.{job}" if scope else f"qbridge.job.{job}"
    return name if len(name) <= 64 else "qbridge.job." + hashlib.sha256(name.encode()).hexdigest()[:48]


def state_scope(engine: sa.Engine, schema: str | None) -> str:
    """Where a job's checkpoint lives: the database (GET_LOCK is server-wide) and the schema."""
    return ".".join(p for p in (engine.url.database or "", schema or "") if p).replace("/", "_")


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for PostgreSQL's advisory locks."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def acquire_statement(dialect: str, name: str) -> tuple[str, dict[str, Any]]:
    """SQL that tries the lock without waiting and returns one row, one column: held or not."""
    if dialect == "postgresql":
        return "SELECT pg_try_advisory_lock(:key)", {"key": advisory_key(name)}
    if dialect in ("mysql", "mariadb"):
        return "SELECT GET_LOCK(:name, 0)", {"name": name}
    if dialect == "mssql":
        return ("SET NOCOUNT ON; DECLARE @r int; EXEC @r = sp_getapplock @Resource = :name, @LockMode = 'Exclusive', "
                "@LockOwner = 'Session', @LockTimeout = 0; SELECT CASE WHEN @r >= 0 THEN 1 ELSE 0 END"), {"name": name}
    raise ValueError(f"no session lock for {dialect}")


def release_statement(dialect: str, name: str) -> tuple[str, dict[str, Any]]:
    """SQL that lets the lock go at once. Closing the session frees it too, but only once the
    server has seen the connection close: a standby asking at once could still find it held."""
    if dialect == "postgresql":
        return "SELECT pg_advisory_unlock(:key)", {"key": advisory_key(name)}
    if dialect in ("mysql", "mariadb"):
        return "SELECT RELEASE_LOCK(:name)", {"name": name}
    return "EXEC sp_releaseapplock @Resource = :name, @LockOwner = 'Session'", {"name": name}


class JobLock:
    """The lock of one job in its target database, kept on a connection of its own."""

    def __init__(self, engine: sa.Engine, job: str, who: str = IDENTITY, schema: str | None = None,
                 connection: str = "the target") -> None:
        self.engine = engine
        self.who = who
        self.job, self.schema, self.connection = job, schema, connection
        self.fence: fence.Fence | None = None  # the epoch this process took with the lock (bridge.ledger.fence)
        # SQLite's lock is a file beside the database, scoped by its path already.
        self.name = lock_name(job, None if engine.dialect.name == "sqlite" else state_scope(engine, schema))
        self._conn: sa.Connection | None = None
        self._file: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None or self._file is not None

    def ensure(self) -> bool:
        """True when this process holds the lock (taking it if free); False when another does.
        A lock whose connection was lost (database restarted) is given up and tried again.
        Taking it raises the job's fencing epoch (bridge.ledger.fence), which `self.fence` then holds."""
        got = self._take()
        if got and self.fence is None:  # newly taken (release() forgets the fence)
            try:
                self.fence = fence.take(self.engine, self.schema, self.job, self.who, self.connection)
            except BaseException:
                self.release()
                raise
        return got

    def _take(self) -> bool:
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
                conn.execute(sa.text("SELECT set_config('application_name', :n, false)"), {"n": self.who[:63]})
                conn.commit()
            self._conn = conn
            return True
        conn.close()
        return False

    def still_held(self) -> bool:
        """Whether this process holds the lock now, without taking it: a session lock lives as
        long as its connection, so a connection that no longer answers lost it (and is dropped)."""
        if self._file is not None:
            return True
        if self._conn is None:
            return False
        try:
            self._conn.exec_driver_sql("SELECT 1").scalar()
            return True
        except sa.exc.DBAPIError:
            self.release()
            return False

    def _flock(self) -> bool:
        if self._file is not None:
            return True
        path = Path(self.engine.url.database or "qbridge").resolve()
        f = open(f"{path}.{self.name}.lock", "ab")  # noqa: SIM115 - the open file is the lock, closed by release()
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
            return f"this process ({self.who})"
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
                    cid = conn.execute(sa.text("SELECT IS_USED_LOCK(:n)"), {"n": self.name}).scalar()
                    return "nobody" if cid is None else f"another process (connection {cid})"
        except sa.exc.SQLAlchemyError as e:
            return f"unknown: {str(getattr(e, 'orig', e)).splitlines()[0]}"
        return "not this process"

    def release(self) -> None:
        self.fence = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            # Closing the session frees the lock; the connection must not go back to the pool
            # still holding it.
            try:
                sql, params = release_statement(self.engine.dialect.name, self.name)
                conn.execute(sa.text(sql), params)
            except Exception:  # noqa: BLE001 - a lost connection: its session, and the lock, end with it
                log.debug("lock %s: not released by statement; closing its session frees it", self.name)
            try:
                conn.invalidate()
            finally:
                conn.close()
        if self._file is not None:
            f, self._file = self._file, None
            f.close()


@contextmanager
def holding(jobs: Sequence[tuple[sa.Engine, str | None, str, str]], wait: float, who: str, attempts: int = 6,
            sleep: Callable[[float], None] = time.sleep) -> Iterator[dict[str, fence.Fence]]:
    """Holds the lock of every (target engine, state schema, job, connection name) while the caller runs
    them, waiting up to `wait` seconds for each; JobBusy names the holder when one does not come
    free. A database that does not answer is retried as every other step is. Yields each job's
    fence (bridge.ledger.fence), which the caller's runners check in every transaction they commit."""
    from bridge.db import describe
    from bridge.retry import with_backoff

    locks: list[JobLock] = []
    try:
        for engine, schema, job, connection in jobs:
            lock = JobLock(engine, job, who, schema, connection)
            deadline = time.monotonic() + wait
            waiting = False
            while True:
                try:
                    got = with_backoff(lock.ensure, f"job {job}: taking its lock", attempts=attempts)
                except sa.exc.SQLAlchemyError as e:
                    raise describe(e, connection, engine.url.render_as_string(hide_password=False)) from None
                if got:
                    break
                if time.monotonic() >= deadline:
                    raise JobBusy(f"job {job!r} is held by {lock.holder()} (a `qbridge run`, most often, which runs it "
                                  f"on its schedule); waited {wait:g}s. Stop that process, or wait longer with --lock-wait")
                if not waiting:
                    log.info("job=%s is held by %s; waiting up to %gs for it", job, lock.holder(), wait)
                    waiting = True
                sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            locks.append(lock)
        yield {lock.job: lock.fence for lock in locks if lock.fence is not None}
    finally:
        for lock in locks:
            lock.release()
