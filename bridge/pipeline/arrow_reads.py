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
        except NotArrow as e:
            if not e.lasting:
                raise
            self._close(source.queue, conn)
            self._off(source.queue, str(e))
            return None
        except BaseException:
            self._close(source.queue, conn)  # a connection that failed is not used again
            raise
        self.reads += 1
        with self._lock:
            forgotten = self._conns.get(source.queue) is not conn
        if forgotten:  # this read-ahead was left as stuck: the queue has another connection by now
            self._close(source.queue, conn)
        return rows

    def _conn(self, queue: str) -> Any:
        with self._lock:
            conn = self._conns.get(queue)
        if conn is None:
            conn = self._connect()
            with self._lock:
                self._conns[queue] = conn
        return conn

    def _connect(self) -> Any:
        import adbc_driver_postgresql.dbapi as adbc

        url = self.engine.url
        if any(isinstance(v, tuple) for v in url.query.values()):
            # A parameter given twice (a list of hosts): psycopg joins them, a libpq URL keeps the last.
            raise ValueError(f"the URL gives {', '.join(k for k, v in url.query.items() if isinstance(v, tuple))} more than once")
        # Text in UTF-8 whatever the database's encoding (the driver copies bytes into Arrow's
        # UTF-8 strings as they come; psycopg decodes by the session's encoding).
        libpq = url.set(drivername="postgresql").update_query_dict({"client_encoding": "UTF8"}).render_as_string(hide_password=False)
        conn = adbc.connect(libpq, autocommit=True)  # no transaction left open between read-aheads
        self.connects += 1
        try:
            cursor = conn.cursor()
            try:
                cursor.execute("SELECT current_setting('client_encoding'), current_setting('server_encoding')")
                client, server = cursor.fetchone()
            finally:
                cursor.close()
            if client != "UTF8" or server == "SQL_ASCII":  # SQL_ASCII: psycopg gives bytes, not text
                raise ValueError(f"the session's encoding is {client} of the database's {server}, not UTF-8 text")
        except BaseException:
            conn.close()
            raise
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
            _close(conn)

    def _close(self, queue: str, conn: Any) -> None:
        """Closes `conn`, the one a read-ahead used, and forgets it if it is still `queue`'s."""
        with self._lock:
            if self._conns.get(queue) is conn:
                del self._conns[queue]
        _close(conn)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001, S110 - a connection already broken: nothing left to close
        pass
