"""A helper review of the ADBC read-ahead (session 15, on ca09a36): each finding as the test that
failed before its fix.

1. A database whose encoding is not UTF-8: ADBC's driver copied its bytes into Arrow's UTF-8
   strings as they came, so a LATIN1 text was delivered altered, or failed every read-ahead. The
   ADBC session now asks for UTF-8 (the server converts), and refuses SQL_ASCII.
2. A stuck read-ahead's failure closed the next read-ahead's connection, in use by another thread;
   its own stayed open. Each read now closes the connection it used.
3. A batch of over 2 GiB of text comes in several chunks a column: only the first was kept. It is
   no Arrow batch now.
4. The time-range guard let the second after datetime.max through (a float's rounding).
5. PostgreSQL's money and oid passed the type guard with other values than psycopg's: the guard
   goes by PostgreSQL's own type now.
6. A `%` in a queue's name was doubled in the statement ADBC ran; a URL with a list of hosts
   sent ADBC to the last one alone (it is not used with such a URL now)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
import sqlalchemy as sa
from helpers import Bridge

from bridge.demo.samples import nginn_body, nginn_row
from bridge.pipeline import read_ahead
from bridge.pipeline.arrow_reads import ArrowReads
from bridge.sources.arrow_fetched import _HIGHEST, ArrowFetched, NotArrow
from bridge.sources.fetched import Fetched, joined
from tests.pipeline.test_read_ahead import _delivered_once
from tests.pipeline.test_read_ahead_adbc import adbc_cursor

QUEUE = "MQueue1"


@pytest.fixture()
def latin1_db(pg_server: str) -> Iterator[str]:
    name = f"qb_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(pg_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"))
    try:
        yield pg_server.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from bridge.db import dispose_all
        dispose_all()
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _rows(text: str) -> list[dict[str, Any]]:
    now = datetime(2024, 5, 6, 7, 8, 9)
    rows = [nginn_row(QUEUE, i, now, headers="Tenant=acme|_NG-Seq=1") for i in range(1, 31)]
    for r in rows:
        r.update(label=f"{text} order", msg_text=nginn_body("Orders.PlaceOrder, Orders", OrderId=1, Customer=text))
    return rows


def _run(tmp_path: Path, src: str, target: str, schema: str, rows: list[dict[str, Any]], adbc: bool, lane: bool) -> tuple:
    tmp_path.mkdir()
    b = Bridge(tmp_path, src, target, target_schema=schema, batch_size=10)
    try:
        assert b.cli("init") == 0
        b.insert(rows)
        runner = b.runner()
        runner.read_ahead.arrow.on = adbc
        if lane:
            runner.lane_min_rows = 1
        error = None
        try:
            runner.drain(QUEUE, lambda p: None)
        except Exception as e:  # noqa: BLE001
            error = e
        out = sorted((r["headers"]["NServiceBus.MessageId"], r["headers"], bytes(r["body"])) for r in b.rows("Orders"))
        with b.source.begin() as conn:
            conn.execute(sa.text(f'DROP TABLE "{QUEUE}"'))
        return out, runner.read_ahead.arrow.reads, error
    finally:
        b.dispose()


@pytest.mark.parametrize("lane", [False, True], ids=["per_row", "lane"])
@pytest.mark.parametrize("text", ["Ã©cole", "Zoë"], ids=["valid_utf8_bytes", "invalid_utf8_bytes"])
def test_latin1_database_rows_read_ahead_by_adbc_are_delivered_as_psycopg_reads_them(
        tmp_path: Path, latin1_db: str, pg_server: str, pg_schema: str, pg_schema2: str, lane: bool, text: str) -> None:
    rows = _rows(text)
    by_psycopg, _, error = _run(tmp_path / "a", latin1_db, pg_server, pg_schema, rows, adbc=False, lane=lane)
    assert error is None and len(by_psycopg) == 30
    assert all(text.encode() in body for _, _, body in by_psycopg)  # UTF-8 of what the legacy row holds
    by_adbc, reads, error = _run(tmp_path / "b", latin1_db, pg_server, pg_schema2, rows, adbc=True, lane=lane)
    assert reads > 0  # the read-aheads did read by ADBC
    assert error is None, repr(error)
    assert by_adbc == by_psycopg


def test_a_stuck_read_aheads_failure_closes_the_next_read_aheads_connection(make, monkeypatch: pytest.MonkeyPatch) -> None:
    import adbc_driver_postgresql.dbapi as adbc

    monkeypatch.setattr(read_ahead, "STUCK_SECONDS", 0.5)
    opened: list[Any] = []
    real_connect = adbc.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        conn = real_connect(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(adbc, "connect", connect)
    b = make(batch_size=10)
    b.insert(b.ready(50))
    runner = b.runner()
    source = runner.sources[QUEUE]
    real = source.fetch_after_arrow
    calls: list[int] = []
    release1, ra2_in, release2 = threading.Event(), threading.Event(), threading.Event()
    ra2_result: list[Any] = []

    def fetch(cursor: Any, after: int, limit: int) -> Any:
        calls.append(after)
        if len(calls) == 1:  # the first read-ahead: stuck, then its connection breaks
            release1.wait(30)
            raise sa.exc.OperationalError("COPY", {}, Exception("server closed the connection unexpectedly"))
        if len(calls) == 2:  # the next read-ahead, on a connection of its own, mid-read
            ra2_in.set()
            release2.wait(30)
            try:
                rows = real(cursor, after, limit)
            except Exception as e:
                ra2_result.append(e)
                raise
            ra2_result.append(len(rows))
            return rows
        return real(cursor, after, limit)

    monkeypatch.setattr(source, "fetch_after_arrow", fetch)
    passes = [0]

    def before() -> None:
        passes[0] += 1
        if passes[0] == 3:  # pass 2 gave the first read-ahead up as stuck; the second is reading
            assert ra2_in.wait(10)
            release1.set()
            time.sleep(0.3)  # the stuck one's failure comes back
            release2.set()

    runner.drain(QUEUE, lambda p: None, before_pass=before)
    _delivered_once(b, 50)  # the passes read themselves: no message is lost
    # The second read-ahead's connection was its own: nobody else closes it under it.
    # ... and the stuck read-ahead's connection is closed once it let go (not left open).
    state = (ra2_result, [c._closed for c in opened])
    assert state == ([10], [True] * len(opened)), repr(state)


def test_closing_a_connection_another_thread_is_reading_on(make) -> None:
    """ArrowReads.close from the stuck read-ahead's thread while the next read-ahead's COPY runs in
    C++ on that connection (Python's lock released): libpq's connection is finished under it."""
    b = make(batch_size=10)
    b.insert(b.ready(20))
    runner = b.runner()
    source = runner.sources[QUEUE]
    arrow = ArrowReads(b.source)
    result: dict[str, Any] = {}

    class Stuck:
        queue = QUEUE

        def fetch_after_arrow(self, cursor: Any, after: int, limit: int) -> Any:
            release.wait(30)
            raise sa.exc.OperationalError("COPY", {}, Exception("server closed the connection unexpectedly"))

    def run(name: str, src: Any) -> None:
        try:
            result[name] = len(arrow.read_after(src, 0, 10))
        except BaseException as e:  # noqa: BLE001
            result[name] = e

    release = threading.Event()
    t1 = threading.Thread(target=run, args=("stuck", Stuck()))
    t1.start()
    deadline = time.monotonic() + 10
    while QUEUE not in arrow._conns and time.monotonic() < deadline:
        time.sleep(0.01)
    arrow.forget(QUEUE)  # ReadAhead.take / _finish, the read-ahead given up as stuck
    url = b.source.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as locker:  # the next read-ahead's COPY waits, in C++, on the table
        locker.execute(f'LOCK TABLE "{b.source_schema}"."{QUEUE}" IN ACCESS EXCLUSIVE MODE')
        t2 = threading.Thread(target=run, args=("next", source))
        t2.start()
        time.sleep(1.0)
        release.set()
        t1.join(10)
        time.sleep(0.3)
        locker.rollback()
    t2.join(30)
    assert result["next"] == 10, repr(result["next"])


def test_a_batch_with_over_2_gib_of_text_is_no_arrow_batch() -> None:
    n = 1100
    body = pa.array(["x" * (1 << 20)] * n, pa.string())  # 1.1 GiB a chunk
    ids = pa.chunked_array([pa.array(range(1, n + 1), pa.int64()), pa.array(range(n + 1, 2 * n + 1), pa.int64())])
    pg = {"id": "int8", "subqueue": "bpchar", "msg_text": "text"}
    schema = pa.schema([pa.field(name, t, metadata={"POSTGRESQL:type": pg[name]})
                        for name, t in (("id", pa.int64()), ("subqueue", pa.string()), ("msg_text", pa.string()))])
    table = pa.table({"id": ids, "subqueue": pa.chunked_array([pa.array(["I"] * n)] * 2),
                      "msg_text": pa.chunked_array([body, body])}, schema=schema)
    assert table.combine_chunks().column("msg_text").num_chunks == 2  # Arrow's own rule
    with pytest.raises(NotArrow, match="msg_text is 2 chunks") as e:
        ArrowFetched(table, "id", int, "subqueue", lambda s: True)
    assert not e.value.lasting  # the pass reads the batch itself; the next is read ahead again
    # Before the fix its rows past the first chunk lost their text, and a join shifted values.
    small = pa.table({"id": pa.chunked_array([pa.array([1, 2], pa.int64())]),
                      "subqueue": pa.chunked_array([pa.array(["I", "I"])]),
                      "msg_text": pa.chunked_array([pa.array(["a"]), pa.array(["b"])])}, schema=schema)
    rows = ArrowFetched(small, "id", int, "subqueue", lambda s: True)  # small chunks are combined
    late = Fetched(["id", "subqueue", "msg_text"], [(9_999_999, "I", "late")], "id", int, "subqueue", lambda s: True)
    both = joined(rows, late)
    assert [r.values for r in both] == [{"id": 1, "subqueue": "I", "msg_text": "a"}, {"id": 2, "subqueue": "I", "msg_text": "b"},
                                        {"id": 9_999_999, "subqueue": "I", "msg_text": "late"}]


def test_highest_is_datetime_max() -> None:
    assert _HIGHEST == (datetime.max - datetime(1970, 1, 1)) // timedelta(microseconds=1)


def test_a_time_in_year_10000_is_no_arrow_batch(make) -> None:
    b = make()
    b.insert(b.ready(3))
    t = b.tables[QUEUE]
    with b.source.begin() as conn:
        conn.execute(t.update().where(t.c.id == 2).values(last_processed=sa.text("'10000-01-01 00:00:00.5'::timestamp")))
    runner = b.runner()
    with b.source.connect() as conn, pytest.raises(sa.exc.DataError, match="after year 10K"):
        runner.sources[QUEUE].fetch_after(conn, None, 10, False)  # psycopg refuses the batch
    with adbc_cursor(b) as cursor, pytest.raises(NotArrow):
        rows = runner.sources[QUEUE].fetch_after_arrow(cursor, None, 10)
        [r.values for r in rows]


@pytest.mark.parametrize("kind, value", [("oid", "3000000000"), ("money", "5")])
def test_arrow_rows_hold_what_psycopg_rows_hold_or_are_no_arrow_batch(make, kind: str, value: str) -> None:
    b = make()
    b.insert(b.ready(3))
    with b.source.begin() as conn:
        conn.execute(sa.text(f'ALTER TABLE "{b.source_schema}"."{QUEUE}" ALTER COLUMN retry_count TYPE {kind} '
                             f'USING retry_count::text::{kind}'))
        conn.execute(sa.text(f'UPDATE "{b.source_schema}"."{QUEUE}" SET retry_count = {value}::{kind} WHERE id = 2'))
    source = b.runner().sources[QUEUE]
    with b.source.connect() as conn:
        by_psycopg = [r.values["retry_count"] for r in source.fetch_after(conn, None, 10, False)]
    with adbc_cursor(b) as cursor:
        try:
            by_arrow = [r.values["retry_count"] for r in source.fetch_after_arrow(cursor, None, 10)]
        except NotArrow:
            return  # the guard caught it: the pass reads by psycopg
    assert by_arrow == by_psycopg


def test_a_queue_named_with_a_percent_is_read_ahead_by_adbc(make) -> None:
    queue = "Q%1"
    b = make(batch_size=10, queues=[queue])
    b.insert(b.ready(40, queue=queue), queue=queue)
    runner = b.runner()
    runner.drain(queue, lambda p: None)
    arrow = runner.read_ahead.arrow
    ids = b.message_ids("Orders", "Sales", "Billing", "Unrouted", "error")
    assert len(ids) == 40 and set(ids.values()) == {1}, ids
    assert (arrow.reads, arrow.connects) == (4, 1)  # today (0, 4): every read-ahead failed and reconnected


def test_the_adbc_connection_goes_where_the_engines_do_or_is_not_made(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """psycopg joins a repeated `host` into libpq's failover list; a libpq URL keeps the last."""
    import adbc_driver_postgresql.dbapi as adbc

    engine = sa.create_engine("postgresql+psycopg://reader@/legacy?host=primary.example&host=standby.example")
    seen: list[str] = []
    monkeypatch.setattr(adbc, "connect", lambda url, **kwargs: seen.append(url))

    class Source:
        queue = QUEUE

        def fetch_after_arrow(self, cursor: Any, after: int, limit: int) -> Any:
            raise AssertionError("read by a connection to the wrong server")

    arrow = ArrowReads(engine)
    assert arrow.read_after(Source(), 0, 10) is None and not arrow.on and seen == []
    assert "the URL gives host more than once" in caplog.text
