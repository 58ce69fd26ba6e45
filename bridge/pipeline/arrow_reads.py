"""A read-ahead's read of a monotonic PostgreSQL queue by ADBC's PostgreSQL driver (issue 49).

psycopg makes a Python object a value while holding Python's lock, so a read-ahead's read took
turns with the pass it runs beside; ADBC's driver reads by COPY BINARY into Arrow in C++ without
it (bridge.sources.arrow_fetched). Copy mode allows the read a connection of its own: a read-ahead
has one already, and each statement reads in a snapshot of its own either way.

One ADBC connection a queue, opened on its drain's first read-ahead and closed when the drain ends
(ReadAhead.drop), used by one read-ahead at a time; one whose read-ahead got stuck is left to it,
and the next opens another. A connection that fails is closed, and the pass reads itself as after
any failed read-ahead. Where the driver cannot connect (not installed, a login libpq cannot make
from the engine's URL) or a queue's columns are of a type Arrow would give Python otherwise, the
process's read-aheads read through SQLAlchemy, as before; QBRIDGE_READ_AHEAD_ADBC=0 says so too.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import sqlalchemy as sa

from bridge.sources import Source

log = logging.getLogger("qbridge.batch")


class ArrowReads:
    """The ADBC connections of one runner's read-aheads, one a queue."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.on = engine.dialect.name == "postgresql" and os.environ.get("QBRIDGE_READ_AHEAD_ADBC") != "0"
        self._conns: dict[str, Any] = {}
        self._lock = threading.Lock()  # _conns is changed by the read-aheads' threads and the pass's
        self.reads = self.connects = 0  # batches read and connections opened (tests count them)

    def read_after(self, source: Source, after: int, limit: int) -> Any:
        """`source`'s `limit` rows after `after` as Arrow columns, or None where ADBC does not read
        them (the caller reads through SQLAlchemy)."""
        read = getattr(source, "fetch_after_arrow", None)
        if not self.on or read is None:
            return None
        from bridge.sources.arrow_fetched import NotArrow

        try:
            conn = self._conn(source.queue)
        except Exception as e:  # noqa: BLE001 - any failure to connect: SQLAlchemy reads, as before
            self._off(source.queue, f"ADBC's PostgreSQL driver did not connect ({type(e).__name__}: {e})")
            return None
        try:
            cursor = conn.cursor()
            try:
                rows = read(cursor, after, limit)
            finally:
                cursor.close()
            self.reads += 1
            return rows
        except NotArrow as e:
            if not e.lasting:
                raise
            self.close(source.queue)
            self._off(source.queue, str(e))
            return None
        except BaseException:
            self.close(source.queue)  # a connection that failed is not used again
            raise

    def _conn(self, queue: str) -> Any:
        with self._lock:
            conn = self._conns.get(queue)
        if conn is None:
            import adbc_driver_postgresql.dbapi as adbc

            url = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            conn = adbc.connect(url, autocommit=True)  # no transaction left open between read-aheads
            self.connects += 1
            with self._lock:
                self._conns[queue] = conn
        return conn

    def _off(self, queue: str, why: str) -> None:
        if self.on:
            self.on = False
            log.warning("queue=%s: read-aheads read through SQLAlchemy, not ADBC: %s", queue, why)

    def forget(self, queue: str) -> None:
        """Leaves `queue`'s connection to a read-ahead that is stuck on it (the next opens another)."""
        with self._lock:
            self._conns.pop(queue, None)

    def close(self, queue: str) -> None:
        """Closes `queue`'s connection (no read-ahead is using it)."""
        with self._lock:
            conn = self._conns.pop(queue, None)
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - a connection already broken: nothing left to close
                pass
