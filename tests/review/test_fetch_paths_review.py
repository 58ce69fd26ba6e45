"""Review of 04486c8, 7b7a409 and 51b7e40 (BizTalk's batch fetch by the queues' key, one statement
a batch on PostgreSQL; binary rows for BizTalk's and OpenJMS's batch fetch; BizTalk's header names
cached; a resumed walk's chunk of a batch and one key): guards that a batch read as binary rows
is the batch read as text rows, value for value and message for message; that the swapped cursor
factory reaches no other statement (a walk's server-side cursor, the statements after, an error
inside, the pool's next user); that `among` takes a uuid column's ids however they are spelled,
and a batch of thousands in its one statement; that the cached header names and values are those
made afresh. And one finding: `by_index` leaves random_page_cost changed when its body raises
without the transaction failing."""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.codecs.biztalk import decode_context
from bridge.db import binary_rows, by_index
from bridge.schemas.text_in import among
from bridge.sources import biztalk as biztalk_module
from bridge.sources import openjms as openjms_module
from bridge.sources.biztalk import header_text, short_name
from tests.systems.test_biztalk_source import FRAGMENTED, SMALL, BizTalk, fx, make_bt
from tests.systems.test_openjms_source import FIXTURES as JMS_FIXTURES
from tests.systems.test_openjms_source import QUEUE_ID, TOPIC_ID, Jms, blob, make_jms

QUEUE = "BizTalkServerApplication"
SUSPENDED = {"nState": 4, "dtSuspendTimeStamp": datetime(2024, 3, 14, 9, 27, 2, 123456), "nvcAdapter": "FILE",
             "nvcURI": "D:\\In\\Zoë №4711\\*.xml", "nvcErrorDescription": "failure\r\nat Zoë's pipeline",
             "info": "routing failure ü"}
CONTEXTS = sorted(p.name for p in (Path(__file__).parents[1] / "fixtures" / "biztalk").glob("*ctx*.bin"))


@pytest.fixture()
def bt_pg(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BizTalk]:
    yield from make_bt("postgres", request, tmp_path)


@pytest.fixture()
def jms_pg(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str) -> Iterator[Jms]:
    yield from make_jms("postgres", request, tmp_path, pg_server, pg_schema)


def _text_rows(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """The source's fetch as before these commits: its statements' rows as text rows."""
    monkeypatch.setattr(module, "binary_rows", lambda conn: contextlib.nullcontext())


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """A fetched row's values with each value's type, parts and fragments included."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k == "parts":
            out[k] = sorted((_typed(p) for p in v), key=repr)
        elif isinstance(v, list):
            out[k] = [(type(x).__name__, x) for x in v]
        else:
            out[k] = (type(v).__name__, v)
    return out


def _fetch_both(monkeypatch: pytest.MonkeyPatch, engine: sa.Engine, source: Any, module: Any) -> tuple[list, list]:
    with engine.connect() as conn:
        keys = list(source.iter_keys(conn))
    random.Random(7).shuffle(keys)
    with engine.begin() as conn:
        as_binary = source.fetch_keys(conn, keys, False)
    with monkeypatch.context() as m:
        _text_rows(m, module)
        with engine.begin() as conn:
            as_text = source.fetch_keys(conn, keys, False)
    assert [r.key for r in as_binary] == [r.key for r in as_text] == keys
    return as_binary, as_text


def test_a_biztalk_batch_is_the_same_from_binary_and_text_rows(bt_pg: BizTalk, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every value of a batch (uuids, nvarchar with non-ASCII text, timestamps to the microsecond,
    ints, the context bags and every fragment's bytes), and every message decoded from it, are the
    same read as psycopg's binary rows as read as text rows: ready and suspended entries, one
    message with two instances, fragmented and multi-part messages, every fixture context."""
    when = datetime(2024, 3, 31, 2, 30, 0, 654321)  # the hour a spring-forward zone does not have
    for i, ctx in enumerate(CONTEXTS):
        bt_pg.publish(context=fx(ctx), parts=[SMALL], when=when)
        bt_pg.publish(context=fx(ctx), parts=[FRAGMENTED, ("attachment", [fx("part_small_uncompressed.bin")], 189)],
                      suspended=SUSPENDED if i % 2 else None)
    message, _ = bt_pg.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
    with bt_pg.source.begin() as conn:  # a second instance of one message, suspended
        conn.execute(bt_pg.bt[f"{QUEUE}Q_Suspended"].insert().values(uidMessageID=message, uidInstanceID=uuid.uuid4()))
    source = bt_pg.runner().sources[QUEUE]
    as_binary, as_text = _fetch_both(monkeypatch, bt_pg.source, source, biztalk_module)
    assert len(as_binary) == 2 * len(CONTEXTS) + 2
    for b, t in zip(as_binary, as_text):
        assert _typed(b.values) == _typed(t.values), b.key
    for b, t in zip(as_binary, as_text):
        _decode_alike(source, b, t, {"time_sent"} if t.values["dtTimeStamp"] is None else set())


def _decode_alike(source: Any, binary: Any, text: Any, unequal: set[str] | None = None) -> None:
    """The two reads of one row decode to the same message (but for the fields `unequal` names:
    a time the source takes from the clock), or fail alike: a row that quarantines must
    quarantine alike."""
    try:
        want = source.decode(text)
    except Exception as e:  # noqa: BLE001 - a row that quarantines must quarantine alike
        with pytest.raises(type(e)):
            source.decode(binary)
        return
    got = source.decode(binary)
    if unequal:
        assert got.model_dump(exclude=unequal) == want.model_dump(exclude=unequal), binary.key
    else:
        assert got == want, binary.key


def test_an_openjms_batch_is_the_same_from_binary_and_text_rows(jms_pg: Jms, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenJMS's handles (varchar ids, int8 consumers and times, char isQueue, bytea blobs of
    every fixture) read as binary rows are those read as text rows, and decode alike."""
    fixtures = sorted(p.name for p in JMS_FIXTURES.glob("*.bin"))
    for n, name in enumerate(fixtures):
        jms_pg.store(lambda c, t, n=n, name=name: openjms_module_message(c, t, f"ID:q-{n}", QUEUE_ID, blob(name), [QUEUE_ID * 100]))
        jms_pg.store(lambda c, t, n=n, name=name: openjms_module_message(c, t, f"ID:t-{n}", TOPIC_ID, blob(name), [201, 202]))
    for queue in ("orders", "prices.eu"):
        source = jms_pg.runner().sources[queue]
        as_binary, as_text = _fetch_both(monkeypatch, jms_pg.source, source, openjms_module)
        assert as_binary
        for b, t in zip(as_binary, as_text):
            assert _typed(b.values) == _typed(t.values), b.key
            _decode_alike(source, b, t)


def openjms_module_message(conn: sa.Connection, t: dict[str, sa.Table], mid: str, dest: int, data: bytes,
                           consumers: list[int]) -> None:
    from bridge.demo.samples import openjms_message

    openjms_message(conn, t, mid, dest, data, consumers, accepted=1_141_916_400_000 + len(mid), delivered=int(dest == TOPIC_ID))


# -- the swapped cursor factory stays where it was put ---------------------------------------------

TEXT_ONLY = "SELECT 12.34::money, 0.1::float4"  # types whose binary rows are other Python values


def _is_text(conn: sa.Connection) -> bool:
    money, real = conn.exec_driver_sql(TEXT_ONLY).one()
    return money == "$12.34" and real == 0.1


def test_binary_rows_reach_no_walk_no_later_statement_and_no_later_user(pg_server: str) -> None:
    """A walk's server-side cursor opened before (and read inside) keeps text rows; a statement
    after the block, after an error inside it, after nested blocks, and the pool's next user of
    the same connection get text rows; inside, binary ones."""
    engine = sa.create_engine(pg_server, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            assert _is_text(conn)
            walk = conn.execute(sa.text("SELECT g, 12.34::money FROM generate_series(1, 50) g")
                                .execution_options(stream_results=True, yield_per=5))
            first = [walk.fetchone() for _ in range(3)]
            with binary_rows(conn):
                assert not _is_text(conn)
                inside = [walk.fetchone() for _ in range(20)]
                with binary_rows(conn):
                    assert not _is_text(conn)
                assert not _is_text(conn)
            rest = walk.fetchall()
            assert [m for _, m in first + inside + rest] == ["$12.34"] * 50
            assert _is_text(conn)
            with pytest.raises(ZeroDivisionError), binary_rows(conn):
                1 / 0  # noqa: B018
            assert _is_text(conn)
            with pytest.raises(sa.exc.DBAPIError), binary_rows(conn):
                conn.exec_driver_sql("SELECT nosuch FROM nowhere")
            conn.rollback()
            assert _is_text(conn)
            raw = conn.connection.driver_connection
        with engine.connect() as again:  # the pool's one connection, for its next user
            assert again.connection.driver_connection is raw
            assert _is_text(again)
    finally:
        engine.dispose()


def test_a_fetch_inside_a_stream_leaves_the_stream_and_what_follows_text(bt_pg: BizTalk) -> None:
    """As `qbridge discover` does: a batch fetched on the connection a key walk streams on, its
    server-side cursor open; the walk's rest and the statements after are as before."""
    for _ in range(30):
        bt_pg.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
    source = bt_pg.runner().sources[QUEUE]
    with bt_pg.source.connect() as conn:
        walk = source.iter_keys(conn)
        head = [next(walk) for _ in range(10)]
        rows = source.fetch_keys(conn, head, False)
        assert [r.key for r in rows] == head
        assert len(head) + len(list(walk)) == 30
        assert _is_text(conn)


# -- among on a uuid column --------------------------------------------------------------------------

def _spellings(u: uuid.UUID) -> list[str]:
    return [str(u), str(u).upper(), "{" + str(u).upper() + "}", u.hex]


@pytest.mark.parametrize("db", ["postgres", "sqlite"])
def test_among_takes_a_uuid_however_spelled_and_nothing(db: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if db == "postgres":
        url, schema = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_schema")
    else:
        url, schema = f"sqlite:///{tmp_path}/u.db", None
    engine = sa.create_engine(url)
    t = sa.Table("among_review", sa.MetaData(), sa.Column("u", sa.Uuid), schema=schema)
    ids = [uuid.uuid4() for _ in range(4)]
    try:
        with engine.begin() as conn:
            t.create(conn)
            conn.execute(t.insert(), [{"u": u} for u in ids])
        with engine.connect() as conn:
            for spelled in zip(*(_spellings(u) for u in ids[:2])):
                got = set(conn.execute(sa.select(t.c.u).where(among(t.c.u, list(spelled), conn.dialect.name))).scalars())
                assert got == set(ids[:2]), spelled
            assert conn.execute(sa.select(t.c.u).where(among(t.c.u, [], conn.dialect.name))).all() == []
    finally:
        engine.dispose()


def test_a_batch_of_thousands_is_one_statement_that_misses_none(bt_pg: BizTalk) -> None:
    """2,500 entries (and 100 keys no entry has, and instances not asked for) in one statement:
    each entry asked for comes once, none is dropped, none that was not asked for."""
    q, s = bt_pg.bt[f"{QUEUE}Q"], bt_pg.bt[f"{QUEUE}Q_Suspended"]
    entries = [(uuid.uuid4(), uuid.uuid4()) for _ in range(2500)]
    others = [(m, uuid.uuid4()) for m, _ in entries[::50]]  # other instances of asked-for messages
    with bt_pg.source.begin() as conn:
        conn.execute(q.insert(), [{"uidMessageID": m, "uidInstanceID": i} for m, i in entries[:2000] + others])
        conn.execute(s.insert(), [{"uidMessageID": m, "uidInstanceID": i} for m, i in entries[2000:]])
    keys = [f"Q:{m}:{i}" for m, i in entries[:2000]] + [f"S:{m}:{i}" for m, i in entries[2000:]]
    absent = [f"Q:{uuid.uuid4()}:{uuid.uuid4()}" for _ in range(100)]
    asked = keys + absent
    random.Random(3).shuffle(asked)
    source = bt_pg.runner().sources[QUEUE]
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    sa.event.listen(bt_pg.source, "before_cursor_execute", seen)
    try:
        with bt_pg.source.begin() as conn:
            rows = source.fetch_keys(conn, asked, False)
    finally:
        sa.event.remove(bt_pg.source, "before_cursor_execute", seen)
    assert [r.key for r in rows] == [k for k in asked if k not in set(absent)]
    assert sum(f'"{QUEUE}Q" LEFT OUTER JOIN' in x for x in statements) == 1, statements


# -- cached header names ----------------------------------------------------------------------------

def _mapping(namespaces: dict[str, str]) -> Any:
    return SimpleNamespace(biztalk=SimpleNamespace(namespaces=namespaces, message_type_property_id=None))


def test_cached_header_names_and_values_are_those_made_afresh(bt_pg: BizTalk) -> None:
    """For every fixture context, with and without namespace overrides, first call and cached:
    the headers are the names and texts the code before the cache made."""
    source = bt_pg.runner().sources[QUEUE]
    for namespaces in ({}, {"http://example.org/orders/properties": "Orders"},
                       {"http://schemas.microsoft.com/BizTalk/2003/system-properties": "System"}):
        source.configure(_mapping(namespaces))
        for _ in range(2):
            for ctx in CONTEXTS:
                _, props = decode_context(fx(ctx))
                want = {f"{short_name(p.namespace, namespaces)}.{p.name}": header_text(p.value)
                        for p in props if p.context_property_type & (1 | 2 | 16)}
                got = source.context(fx(ctx))[0]
                assert got == want, (ctx, namespaces)


# -- finding: by_index's setting outlives an error inside it -----------------------------------------

@pytest.mark.parametrize("fails", ["python", "row_value"])
def test_by_index_puts_random_page_cost_back_when_its_body_raises(pg_server: str, fails: str) -> None:
    """`by_index` says the value in force before is put back after. An exception inside that does
    not fail the transaction (a Python error, or psycopg's client-side DataError on a row value it
    cannot load, e.g. a timestamp of 'infinity') leaves 1.1 in force for the rest of the
    transaction: the restore is not in a `finally`."""
    engine = sa.create_engine(pg_server)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("SET LOCAL random_page_cost = 3")
            if fails == "python":
                with pytest.raises(ValueError), by_index(conn):
                    raise ValueError("a row the fetch could not make a message of")
            else:  # as BizTalk's fetch meets a Spool.dtExpiration of 'infinity': psycopg refuses it client-side
                with pytest.raises(sa.exc.DataError), by_index(conn), binary_rows(conn):
                    conn.exec_driver_sql("SELECT 'infinity'::timestamp").all()
                assert conn.connection.driver_connection.info.transaction_status.name == "INTRANS"  # not failed
            assert conn.exec_driver_sql("SHOW random_page_cost").scalar() == "3"
    finally:
        engine.dispose()
