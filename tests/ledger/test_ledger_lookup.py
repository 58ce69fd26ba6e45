"""The ledger lookup every batch makes before it delivers (bridge.ledger.ledger_lookup): on
PostgreSQL the keys go as one text the server splits (issue 49), so a key holding the separator,
quotes, braces, commas, backslashes or nothing at all must still be found, and a key not in the
ledger never is: a key missed is a message delivered twice, a key found wrongly one never
delivered. Held to the plain IN lookup of the other databases, on the same keys."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.db import engine_for
from bridge.ledger.ledger_lookup import KEY_SEPARATOR, entries
from bridge.ledger.state import ledger_table

ODD = ["", " ", ",", '"', "'", "{", "}", "{}", "\\", "NULL", "null", KEY_SEPARATOR, f"a{KEY_SEPARATOR}b",
       f"{KEY_SEPARATOR}{KEY_SEPARATOR}", "é", "\u2028", "ID:1", "Q:7a0f:1b2c", "a b", "a,b", '{"a"}']


@pytest.fixture(params=["postgres", "sqlite", "mariadb"])
def ledger(request, tmp_path: Path):
    if request.param == "postgres":
        url, schema = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_schema")
    elif request.param == "mariadb":
        url, schema = request.getfixturevalue("mariadb_database"), None
    else:
        url, schema = f"sqlite:///{tmp_path}/l.db", None
    e = engine_for(url)
    table = ledger_table(schema, sa.MetaData())
    table.create(e)
    yield e, table
    table.drop(e)


def _book(e: sa.Engine, table: sa.Table, origin: int, keys: list[str]) -> None:
    with e.begin() as conn:
        conn.execute(table.insert(), [dict(origin=origin, source_key=k, message_id="m", job="j", queue="q",
                                           outcome=("delivered", "skipped", "quarantined")[i % 3],
                                           at=datetime(2026, 1, 1)) for i, k in enumerate(keys)])


def test_odd_keys_are_found_and_others_are_not(ledger) -> None:
    e, table = ledger
    if e.dialect.name == "mysql":  # MariaDB's default collation pads and folds case: its keys compare so
        booked = [k for k in ODD if k not in ("", " ", "null")]
    else:
        booked = ODD
    _book(e, table, 1, booked[::2])
    _book(e, table, 2, booked[1::2])  # another queue's keys: never an answer for this one
    with e.connect() as conn:
        found = entries(conn, table, 1, booked)
        alone = {k: entries(conn, table, 1, [k]) for k in booked}
    assert set(found) == set(booked[::2])
    assert all(bool(alone[k]) == (k in booked[::2]) for k in booked), alone
    assert found[booked[0]] == "delivered"


_key = st.text(st.sampled_from(["a", "b", ",", '"', "{", "}", "\\", " ", KEY_SEPARATOR, "é"]), max_size=6)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(_key, unique=True, max_size=30), st.lists(_key, max_size=30))
def test_any_keys_are_looked_up_exactly_on_postgresql(pg_server, pg_schema, booked: list[str], asked: list[str]) -> None:
    e = engine_for(pg_server)
    table = ledger_table(pg_schema, sa.MetaData(), name=f"l_{abs(hash((tuple(booked), tuple(asked)))) % 10**9}")
    table.create(e)
    try:
        if booked:
            _book(e, table, 1, booked)
        with e.connect() as conn:
            assert set(entries(conn, table, 1, asked)) == set(booked) & set(asked)
    finally:
        table.drop(e)


def test_the_split_keys_use_the_ledgers_key_index(pg_server, pg_schema) -> None:
    e = engine_for(pg_server)
    table = ledger_table(pg_schema, sa.MetaData())
    table.create(e)
    _book(e, table, 1, [f"k{i}" for i in range(20_000)])
    with e.begin() as conn:
        conn.execute(sa.text(f'ANALYZE "{pg_schema}".{table.name}'))
        keys = KEY_SEPARATOR.join(f"k{i}" for i in range(0, 20_000, 400))  # a batch's keys among a queue's many
        plan = "\n".join(r[0] for r in conn.execute(sa.text(
            f"EXPLAIN SELECT source_key, outcome FROM \"{pg_schema}\".{table.name} "
            f"WHERE origin = 1 AND source_key = ANY(string_to_array(:k, :s))"), {"k": keys, "s": KEY_SEPARATOR}))
    condition = plan.split("Index Cond")[1].splitlines()[0]
    assert f"using {table.name}_pkey" in plan and "source_key" in condition and "ANY" in condition, plan


def test_a_batch_is_looked_up_by_the_ledger_key_not_by_reading_the_queue(pg_server: str, pg_schema: str) -> None:
    """issue 49: below some millions of entries PostgreSQL read every entry of the queue for a
    batch's lookup (a bitmap over the origin, or a scan), costing its key probes as random disk
    reads; the lookup runs with the probes costed as the neighbours they are, and the setting
    does not outlive it."""
    import json

    from bridge.ledger.ledger_lookup import entries
    from bridge.ledger.state import ledger_table

    engine = sa.create_engine(pg_server)
    ledger = ledger_table(pg_schema)
    with engine.begin() as conn:
        ledger.create(conn)
        conn.exec_driver_sql(
            f'INSERT INTO "{pg_schema}".qbridge_ledger (origin, source_key, message_id, job, queue, outcome, at) '
            "SELECT 7, 'ID:k-' || lpad(g::text, 7, '0') || '#100', md5(g::text)::uuid::text, 'j', 'q', 'delivered', "
            "now() FROM generate_series(1, 100000) g")
        conn.exec_driver_sql(f'ANALYZE "{pg_schema}".qbridge_ledger')
    keys = [f"ID:k-{g:07d}#100" for g in range(50_001, 52_001)]
    seen: list[tuple[str, object]] = []

    def capture(conn: object, cursor: object, statement: str, parameters: object, *_: object) -> None:
        seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", capture)
    with engine.begin() as conn:
        before = conn.exec_driver_sql("SHOW random_page_cost").scalar()
        found = entries(conn, ledger, 7, keys)
        assert conn.exec_driver_sql("SHOW random_page_cost").scalar() == before
    sa.event.remove(engine, "before_cursor_execute", capture)
    assert len(found) == 2000
    plans = []
    with engine.connect() as conn:  # the lookup's statements again, its SELECT explained
        cur = conn.connection.driver_connection.cursor()
        for statement, parameters in seen:
            if "qbridge_ledger" in statement:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
                plans.append(cur.fetchone()[0])
            elif "random_page_cost" in statement and "SHOW" not in statement:
                cur.execute(statement, parameters)
        conn.rollback()
    engine.dispose()
    [plan] = plans
    text = json.dumps(plan)
    assert '"Index Name": "qbridge_ledger_pkey"' in text and "Seq Scan" not in text, text[:300]
