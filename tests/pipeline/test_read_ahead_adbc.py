"""A copy-mode read-ahead of a PostgreSQL NGinn queue reads by ADBC's PostgreSQL driver as Arrow
columns (bridge/pipeline/arrow_reads.py, bridge/sources/arrow_fetched.py): its rows hold exactly
the values psycopg's rows hold; a batch or a queue it cannot read so, a driver that cannot
connect, or a read that fails leave the rows to SQLAlchemy, with every row once; a drain's end
closes its connection."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.sources.arrow_fetched import ArrowFetched, NotArrow
from bridge.sources.fetched import Fetched, joined
from tests.pipeline.test_read_ahead import _delivered_once, _drain, _in_read_ahead

QUEUE = "MQueue1"


@contextmanager
def adbc_cursor(b: Any) -> Iterator[Any]:
    """A cursor of ADBC's PostgreSQL driver on `b`'s legacy database, closed after."""
    import adbc_driver_postgresql.dbapi as adbc

    with adbc.connect(b.source.url.set(drivername="postgresql").render_as_string(hide_password=False)) as a:
        cursor = a.cursor()
        try:
            yield cursor
        finally:
            cursor.close()


def _odd_rows(b: Any) -> list[dict[str, Any]]:
    """Every state, empty and long values, NULLs, text beyond Latin-1, microseconds."""
    rows = []
    for i, state in enumerate(["I", "R", "F", "X"] * 5, start=1):
        r = b.ready(1, start=i)[0]
        r.update(subqueue=state, retry_count=i % 3, insert_time=datetime(2024, 3, 14, 9, 26, 53, 123456 + i),
                 last_processed=None if i % 2 else datetime(1753, 1, 1), error_info="x" * 3000 if state == "F" else None,
                 correlation_id=None if i % 5 == 0 else "", label="Zoë №4711 \U0001f600", unique_id=None)
        if i % 7 == 0:
            r.update(msg_text=None, msg_headers=None)
        rows.append(r)
    return rows


def test_arrow_rows_hold_what_psycopg_rows_hold(make) -> None:
    b = make()
    b.insert(_odd_rows(b))
    runner = b.runner()
    source = runner.sources[QUEUE]
    with b.source.connect() as conn:
        by_psycopg = source.fetch_after(conn, None, 100, False)
    with adbc_cursor(b) as cursor:
        by_arrow = source.fetch_after_arrow(cursor, None, 100)
    assert isinstance(by_arrow, ArrowFetched) and isinstance(by_psycopg, Fetched) and len(by_arrow) == len(by_psycopg) == 20
    assert by_arrow.keys == by_psycopg.keys and by_arrow.consumable == by_psycopg.consumable
    for mine, theirs in zip(by_arrow, by_psycopg):  # the first rows from the arrays, the rest from whole columns
        assert mine.key == theirs.key and mine.consumable == theirs.consumable
        assert mine.values == theirs.values
        assert {k: type(v) for k, v in mine.values.items()} == {k: type(v) for k, v in theirs.values.items()}
    assert [list(t) for t in by_arrow.tuples()] == [list(t) for t in by_psycopg.tuples()]
    # A batch's late rows (psycopg's) then the rows read ahead, as one batch.
    assert [r.values for r in joined(by_psycopg, by_arrow)] == [r.values for r in by_psycopg] * 2


def test_a_time_python_cannot_hold_is_no_arrow_batch(make) -> None:
    b = make()
    b.insert(b.ready(3))
    t = b.tables[QUEUE]
    with b.source.begin() as conn:
        conn.execute(t.update().where(t.c.id == 2).values(retry_time=sa.text("'infinity'::timestamp")))
    runner = b.runner()
    with adbc_cursor(b) as cursor, pytest.raises(NotArrow, match="retry_time holds a time outside") as e:
        runner.sources[QUEUE].fetch_after_arrow(cursor, None, 10)
    assert not e.value.lasting  # the next batch may be read so


def test_columns_of_another_type_turn_adbc_off_and_the_rows_come_once(make, caplog: pytest.LogCaptureFixture) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(35))
    with b.source.begin() as conn:  # a numeric is Python's Decimal from psycopg, Arrow's decimal128 from ADBC
        conn.execute(sa.text(f'ALTER TABLE "{b.source_schema}"."{QUEUE}" ALTER COLUMN retry_count TYPE numeric(10, 0)'))
    runner = b.runner()
    assert [p.read for p in _drain(runner)] == [10, 10, 10, 5]
    assert not runner.read_ahead.arrow.on and runner.read_ahead.arrow.reads == 0
    assert "read through SQLAlchemy, not ADBC: column retry_count is PostgreSQL's numeric" \
        in caplog.text
    assert runner.read_ahead.taken == 3  # read ahead all the same, through SQLAlchemy
    _delivered_once(b, 35)


def test_a_driver_that_cannot_connect_leaves_the_reads_to_sqlalchemy(make, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import adbc_driver_postgresql.dbapi as adbc

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionRefusedError("[libpq] Failed to connect: password authentication failed")

    monkeypatch.setattr(adbc, "connect", refused)
    b = make(batch_size=10)
    b.insert(b.ready(30))
    runner = b.runner()
    assert [p.read for p in _drain(runner)] == [10, 10, 10, 0]
    assert runner.read_ahead.taken == 3 and runner.read_ahead.arrow.reads == 0
    assert "read through SQLAlchemy, not ADBC: ADBC's PostgreSQL driver did not connect (ConnectionRefusedError: [libpq]" in caplog.text
    assert caplog.text.count("not ADBC") == 1  # said once, not a pass
    _delivered_once(b, 30)


def test_a_failed_adbc_read_is_the_passs_to_make_and_the_next_connects_again(make, monkeypatch: pytest.MonkeyPatch) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(45))
    runner = b.runner()
    failed: list[int] = []

    def once() -> None:
        if not failed:
            failed.append(1)
            raise sa.exc.OperationalError("COPY", {}, Exception("server closed the connection unexpectedly"))

    _in_read_ahead(monkeypatch, runner.sources[QUEUE], "fetch_after_arrow", once)
    assert [p.read for p in _drain(runner)] == [10, 10, 10, 10, 5]
    arrow = runner.read_ahead.arrow
    assert failed and arrow.on and arrow.connects == 2 and arrow.reads == 3 and runner.read_ahead.taken == 3
    _delivered_once(b, 45)


def test_a_drain_closes_its_adbc_connection(make, pg_schema: str) -> None:
    b = make(batch_size=10)
    b.insert(b.ready(30))
    runner = b.runner()
    adbc_sessions = sa.text("SELECT count(*) FROM pg_stat_activity WHERE query LIKE :q")
    its_reads = {"q": f"COPY (SELECT %{pg_schema}%) TO STDOUT (FORMAT binary)"}  # the ADBC session's last statement
    during: list[int] = []
    before = set(threading.enumerate())  # an earlier test's stuck read-ahead may still be sleeping

    def look() -> None:
        with b.source.connect() as conn:
            during.append(conn.execute(adbc_sessions, its_reads).scalar_one())

    assert [p.read for p in _drain(runner, before_pass=look)] == [10, 10, 10, 0]
    # Its connection opens with the first read-ahead (its thread may not have made it by the second pass).
    assert runner.read_ahead.arrow.reads == 3 and during[0] == 0 and max(during) == 1
    assert runner.read_ahead.arrow._conns == {}
    with b.source.connect() as conn:
        assert conn.execute(adbc_sessions, its_reads).scalar_one() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("qbridge-read-ahead") and t not in before]


def test_a_fresh_process_has_arrow_imported_before_its_first_read_ahead_begins(make) -> None:
    """Two threads importing pyarrow at once can see it half made ("cannot import name 'BuildInfo'
    from partially initialized module 'pyarrow.lib'"): a fresh `sync --once` failed its first pass
    so, now and then, its read-ahead importing Arrow and ADBC while the pass's lane imported Arrow.
    So the thread that starts a read-ahead imports them first, and the read-ahead's thread never
    imports them for the first time."""
    import subprocess
    import sys

    b = make(batch_size=10)
    b.insert(b.ready(25))
    script = (
        "import sys, threading\n"
        "seen = []\n"
        "real = threading.Thread.start\n"
        "def start(self):\n"
        "    if self.name.startswith('qbridge-read-ahead'):\n"
        "        seen.append(sorted(m for m in ('pyarrow', 'pyarrow.compute', 'adbc_driver_postgresql.dbapi') if m not in sys.modules))\n"
        "    return real(self)\n"
        "threading.Thread.start = start\n"
        "from bridge.commands.main import main\n"
        "rc = main(['sync', '--once', '-c', sys.argv[1]])\n"
        "print('MISSING', seen)\n"
        "sys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", script, str(b.config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "MISSING [[], []]" in done.stdout, done.stdout
    assert b.count("Orders") == 25
