"""Review guards for the PostgreSQL ledger lookup that sends a batch's keys as one text the server
splits (bridge.ledger.ledger_lookup.entries, commit "Ledger lookup on PostgreSQL: the batch's keys
as one text the server splits"). No input was found where it answers otherwise than the text[]
form it replaced; these tests hold it to that form (and to plain set semantics) on the inputs most
likely to break a split, under generic plans of server-side prepared statements, and check that
it neither blocks on nor locks more than the old SELECT did."""

from __future__ import annotations

import random
import re
from datetime import datetime

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from bridge.db import engine_for
from bridge.ledger.ledger_lookup import KEY_SEPARATOR, entries
from bridge.ledger.state import ledger_table
from bridge.model import LEDGER_KEY_MAX

SEP = KEY_SEPARATOR
# What a split could get wrong: empty and blank keys, the separator and its ASCII neighbours, other
# control characters, array-literal syntax, Unicode that normalises or folds alike, the longest key.
EDGE = ["", " ", "  ", "a", "a ", " a", "A", SEP, f"{SEP}a", f"a{SEP}", f"a{SEP}b", SEP * 2, "\x1e", "\x1d", "\x1c",
        "\x01", "\x7f", "\t", "\n", "\r\n", "é", "e\u0301", "ß", "SS", "İ", "\u00a0", "\u2028", "\ufeff", "\U0001f600",
        "NULL", "{}", '"', "\\", ",", "ID:1", "x" * LEDGER_KEY_MAX]


def _array_form(conn: sa.Connection, l: sa.Table, origin: int, keys: list[str]) -> dict[str, str]:
    """The lookup as it was before the change (one text[] parameter): the reference."""
    stmt = sa.select(l.c.source_key, l.c.outcome).where(
        l.c.origin == origin, l.c.source_key == sa.any_(sa.bindparam("keys", type_=ARRAY(sa.String))))
    return dict(conn.execute(stmt, {"keys": list(keys)}).all())


def _book(e: sa.Engine, table: sa.Table, origin: int, keys: list[str]) -> None:
    with e.begin() as conn:
        conn.execute(table.insert(), [{"origin": origin, "source_key": k, "message_id": "m", "job": "j", "queue": "q",
                                           "outcome": ("delivered", "skipped", "quarantined")[i % 3],
                                           "at": datetime(2026, 1, 1)} for i, k in enumerate(keys)])


def _book_many(e: sa.Engine, table: sa.Table, n: int) -> None:
    """n entries over 4 origins, keys 'k<i>' (origin i % 4 + 1), analysed."""
    name = e.dialect.identifier_preparer.format_table(table)
    with e.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {name} (origin, source_key, message_id, job, queue, outcome, at) "
                             f"SELECT g % 4 + 1, 'k' || g, 'm', 'j', 'q', 'delivered', now() "
                             f"FROM generate_series(0, {n - 1}) g"))
        conn.execute(sa.text(f"ANALYZE {name}"))


@pytest.fixture()
def pg_ledger(pg_server, pg_schema):
    e = engine_for(pg_server)
    table = ledger_table(pg_schema, sa.MetaData())
    table.create(e)
    yield e, table


def test_split_lookup_answers_as_the_array_did_on_edge_keys(pg_ledger) -> None:
    e, table = pg_ledger
    _book(e, table, 1, EDGE[::2])
    _book(e, table, 2, EDGE[1::2])  # the other keys under another queue: never an answer for origin 1
    rnd = random.Random(49)
    batches = [[], [""], ["", ""], ["", "a"], ["a", ""], ["a", "a", "a"], [SEP], [SEP, ""], ["x" * (LEDGER_KEY_MAX + 1)],
               ["x" * 10_000, "a"], EDGE, EDGE[::-1], EDGE + EDGE]
    batches += [[k] for k in EDGE]
    batches += [rnd.choices(EDGE + ["zz", "\x1e\x1f"], k=rnd.randrange(0, 12)) for _ in range(400)]
    with e.connect() as conn:
        for keys in batches:
            for origin, booked in ((1, set(EDGE[::2])), (2, set(EDGE[1::2])), (3, set())):
                got = entries(conn, table, origin, keys)
                assert set(got) == booked & set(keys), (origin, keys)
                assert got == _array_form(conn, table, origin, keys), (origin, keys)


def test_a_full_batch_with_and_without_a_separator_key(pg_ledger) -> None:
    e, table = pg_ledger
    booked = [f"Q:{i:04x}:{i * 7919 % 65536:04x}" for i in range(3000)]
    _book(e, table, 1, booked[::2] + [f"odd{SEP}key"])
    with e.connect() as conn:
        for extra in ([], [f"odd{SEP}key"], [SEP]):
            keys = booked[1000:2000] + extra  # half in the ledger
            want = {k for k in keys if k in set(booked[::2])} | ({f"odd{SEP}key"} & set(extra))
            assert set(entries(conn, table, 1, keys)) == want
            assert entries(conn, table, 1, keys) == _array_form(conn, table, 1, keys)


def test_bad_keys_fail_as_they_did_before_the_server_sees_them(pg_ledger) -> None:
    """A NUL (or a lone surrogate) is refused by psycopg before anything is sent, in both forms:
    the transaction stays usable (callers never pass one: bridge.model.ledger_safe_key)."""
    e, table = pg_ledger
    _book(e, table, 1, ["a"])
    with e.begin() as conn:
        for bad, error in ((["a\x00b", "a"], sa.exc.DataError), (["\ud800", "a"], UnicodeEncodeError)):
            with pytest.raises(error):
                entries(conn, table, 1, bad)
            with pytest.raises(error):
                _array_form(conn, table, 1, bad)
        assert entries(conn, table, 1, ["a"]) == {"a": "delivered"}  # the transaction was not aborted


def _captured(e: sa.Engine, table: sa.Table, lookup, keys: list[str]) -> tuple[str, dict]:
    """The SQL and parameters `lookup` (entries or _array_form) sends for `keys` under origin 1."""
    seen: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement, dict(parameters)))

    sa.event.listen(e, "before_cursor_execute", capture)
    try:
        with e.connect() as conn:
            lookup(conn, table, 1, keys)
    finally:
        sa.event.remove(e, "before_cursor_execute", capture)
    (statement, parameters), = [s for s in seen if "ANY" in s[0]]
    return statement, parameters


def _plan(server: str, mode: str, statement: str, parameters: dict) -> str:
    """EXPLAIN of `statement` prepared server-side and run under plan_cache_mode `mode`."""
    names: list[str] = []

    def number(m: re.Match) -> str:
        if m[1] not in names:
            names.append(m[1])
        return f"${names.index(m[1]) + 1}"

    positional = re.sub(r"%\((\w+)\)s", number, statement)
    url = sa.engine.make_url(server).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(url) as raw:
        raw.execute(f"SET plan_cache_mode = {mode}")
        raw.execute(f"PREPARE lookup AS {positional}")
        args = ", ".join(psycopg.sql.Literal(parameters[n]).as_string(raw) for n in names)
        return "\n".join(r[0] for r in raw.execute(f"EXPLAIN (COSTS OFF) EXECUTE lookup({args})"))


def _shape(plan: str) -> list[str]:
    """The plan's nodes and the index each uses, without conditions or constants."""
    return [re.sub(r"\s+on\s+\S+\s*$", "", line.strip(" ->")) for line in plan.splitlines()
            if not line.strip().startswith(("Index Cond", "Filter", "Recheck Cond"))]


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_lookup_as_sent_plans_like_the_array_did(pg_server, pg_ledger, mode) -> None:
    """The statement entries() sends, prepared server-side: in a generic plan (what a prepared
    statement keeps after 5 runs) the split keys are the key index's condition, never a per-row
    filter; in a custom plan the planner folds the split to the very array the old form sent, so
    it picks the same plan."""
    e, table = pg_ledger
    size = 200_000
    _book_many(e, table, size)
    keys = [f"k{i}" for i in range(0, size, size // 1000)]  # a 1000-key batch, a quarter of it under origin 1
    plan = _plan(pg_server, mode, *_captured(e, table, entries, keys))
    before = _plan(pg_server, mode, *_captured(e, table, _array_form, keys))
    assert "string_to_array" in _captured(e, table, entries, keys)[0]
    assert _shape(plan) == _shape(before), (plan, before)
    assert "Seq Scan" not in plan, plan
    if mode == "force_generic_plan":
        assert f"Index Scan using {table.name}_pkey" in plan, plan
        condition = plan.split("Index Cond:")[1].splitlines()[0]
        assert "source_key" in condition and "string_to_array" in condition, plan
        assert "Filter" not in plan, plan  # the split is evaluated once per scan, not once per row


def test_generic_plans_of_prepared_statements_answer_alike(pg_server, pg_ledger) -> None:
    """psycopg's server-side prepared statements (prepare_threshold) with the generic plan forced:
    every batch, those after the plan is cached too, gets exactly its keys."""
    e, table = pg_ledger
    _book_many(e, table, 20_000)
    prepared = sa.create_engine(pg_server, connect_args={"prepare_threshold": 0})

    @sa.event.listens_for(prepared, "connect")
    def _generic(dbapi_connection, record):
        with dbapi_connection.cursor() as cur:
            cur.execute("SET plan_cache_mode = force_generic_plan")
        dbapi_connection.commit()

    rnd = random.Random(5)
    try:
        with prepared.connect() as conn:
            for _ in range(12):
                origin = rnd.randrange(1, 5)
                keys = [f"k{rnd.randrange(0, 40_000)}" for _ in range(rnd.randrange(1, 300))]
                want = {k for k in keys if int(k[1:]) < 20_000 and int(k[1:]) % 4 + 1 == origin}
                assert set(entries(conn, table, origin, keys)) == want
            generic = conn.execute(sa.text("SELECT coalesce(sum(generic_plans), 0) FROM pg_prepared_statements "
                                           "WHERE statement LIKE '%string_to_array%'")).scalar_one()
            assert generic >= 10
    finally:
        prepared.dispose()


def test_the_lookup_takes_no_lock_but_access_share_and_waits_for_no_writer(pg_server, pg_ledger) -> None:
    e, table = pg_ledger
    _book(e, table, 1, ["a", "b"])
    writer = sa.create_engine(pg_server)
    try:
        with writer.connect() as w:
            w.begin()
            w.execute(table.insert(), {"origin": 1, "source_key": "c", "message_id": "m", "job": "j", "queue": "q",
                                           "outcome": "delivered", "at": datetime(2026, 1, 1)})  # not committed
            w.execute(sa.delete(table).where(table.c.source_key == "b"))  # row-locked, not committed
            with e.begin() as conn:
                conn.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
                assert entries(conn, table, 1, ["a", "b", "c"]) == {"a": "delivered", "b": "skipped"}
                modes = set(conn.execute(sa.text(
                    "SELECT mode FROM pg_locks WHERE pid = pg_backend_pid() AND relation IN "
                    "(CAST(:t AS regclass), CAST(:i AS regclass))"),
                    {"t": f'"{table.schema}".{table.name}', "i": f'"{table.schema}".{table.name}_pkey'}).scalars())
                assert modes == {"AccessShareLock"}
            w.rollback()
    finally:
        writer.dispose()
