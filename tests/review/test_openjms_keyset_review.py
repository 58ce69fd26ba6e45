"""A review of 9de67e9 (issue 49): OpenJMS's keyset and the pass's walk take the destination by
its id as one value, `h.destinationid = (SELECT destinationid FROM destinations WHERE name = :queue
ORDER BY destinationid LIMIT 1)` (`_here`), not by a join on its name; `_destination` orders by id
so that fetch, consume and give-back use the row `_here` reads.

Finding: PostgreSQL's OpenJMS create script has no unique index on destinations.name (MySQL's, SQL
Server's have one). With two destinations of one name, only the lowest id is read: the other's
handles are never delivered, and neither the backlog nor `verify` counts them, so the job reports
clean. Not new (the parent commit misses them too, and its join listed a key twice when both rows
held the same consumer and message ids, which this change fixed); `test_a_second_destination_...`
failed on the reviewed code and on its parent. Fixed: refuse the name in `check_schema` (SourceSchemaError when more
than one destinations row has it), which `sync`, `run` and `verify` all pass through.

The guards pin what the change got right: the walk, the slices, the count and the fetch all agree
on one destination (no key listed that fetch cannot find, none fetched that the walk does not list, none twice),
and the scalar subquery renders as TOP 1 / LIMIT 1 with its ORDER BY on SQL Server, MariaDB, SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.demo.samples import openjms_destination, openjms_message
from bridge.errors import SourceSchemaError
from bridge.schemas.openjms import tables
from bridge.sources.openjms import OpenJMSSource
from tests.systems.test_openjms_source import QUEUE_ID, SUBSCRIBERS, TOPIC_ID, Jms, blob, make_jms


@pytest.fixture(params=["postgres", "mariadb"])
def both(request, tmp_path: Path, pg_server: str, pg_schema: str) -> Iterator[Jms]:
    yield from make_jms(request.param, request, tmp_path, pg_server, pg_schema)


@pytest.fixture()
def pg_jms(request, tmp_path: Path, pg_server: str, pg_schema: str) -> Iterator[Jms]:
    yield from make_jms("postgres", request, tmp_path, pg_server, pg_schema, queues=["orders"])


def _source(j: Jms, conn: sa.Connection) -> OpenJMSSource:
    if j.source_schema:
        conn.execute(sa.text(f'SET search_path TO "{j.source_schema}"'))
    return j.runner().sources["orders"]


# -- the finding -------------------------------------------------------------------------------
@pytest.mark.parametrize("other_id", [9, 0], ids=["higher-id", "lower-id"])
def test_a_second_destination_of_the_same_name_is_neither_delivered_nor_reported(pg_jms: Jms, other_id: int) -> None:
    """PostgreSQL: a second `orders` row (created while the job runs: OpenJMS's PostgreSQL script
    allows it) holds a handle. Either the job delivers every handle of the name, or it says that it
    cannot (sync or verify fails). Now: sync succeeds, one handle is delivered, verify is clean.
    With a lower id, the handle of the destination the job was reading drops out of the walk."""
    pg_jms.queue_message("ID:q-1")
    assert pg_jms.cli("sync", "--once") == 0 and pg_jms.count("Orders") == 1
    pg_jms.queue_message("ID:q-3")  # the destination the job reads gets one more
    pg_jms.store(lambda c, t: openjms_destination(c, t, "orders", other_id, True))
    pg_jms.store(lambda c, t: openjms_message(c, t, "ID:q-2", other_id, blob("text_simple.bin"), [other_id * 100]))
    synced = pg_jms.cli("sync", "--once")
    delivered = pg_jms.count("Orders")
    verified = pg_jms.cli("verify")
    assert delivered == 3 or (synced != 0 or verified != 0), (
        f"sync={synced} verify={verified}: {delivered} of 3 handles delivered and nothing says so")


# -- guards --------------------------------------------------------------------------------------
def test_guard_walk_slices_count_and_fetch_agree_with_a_same_named_destination(pg_jms: Jms) -> None:
    """Every reader of the keyset (iter_keys, iter_aged, slice_page, slice_boundaries, count_keys)
    lists exactly the handles fetch_keys finds, with a second `orders` (higher id) holding handles
    under the same consumer and message ids: none listed that fetch cannot find (a pass would pick
    it for ever), none doubled by the join."""
    pg_jms.store(lambda c, t: openjms_destination(c, t, "orders", 9, True))
    for i in range(7):
        pg_jms.store(lambda c, t, i=i: openjms_message(c, t, f"ID:g-{i}", QUEUE_ID, blob("text_simple.bin"),
                                                       [QUEUE_ID * 100], accepted=1000 - i))
        # the same ids again under the other destination (its consumer reuses the queue's id)
        pg_jms.store(lambda c, t, i=i: c.execute(t["message_handles"].insert().values(
            messageid=f"ID:g-{i}", destinationid=9, consumerid=QUEUE_ID * 100, priority=4, acceptedtime=1,
            sequencenumber=i, expirytime=0, delivered=0)))
    with pg_jms.source.connect() as conn:
        source = _source(pg_jms, conn)
        walk = list(source.iter_keys(conn))
        aged = [k for k, _ in source.iter_aged(conn)]
        paged, after = [], None
        while True:
            keys, after = source.slice_page(conn, after, None, 3)
            if not keys:
                break
            paged += keys
        bounds = source.slice_boundaries(conn, 2)
        sliced, lo = [], None
        for hi in [*bounds, None]:
            sliced += list(source.iter_slice(conn, lo, hi))
            lo = hi
        assert len(walk) == 7 == len(set(walk)) == source.count_keys(conn)
        assert walk == aged == paged == sliced
        # and a fetch refuses the name two destinations hold, naming both (the finding's fix)
        with pytest.raises(SourceSchemaError, match=r"destinations 1 and 9 are both named 'orders'"):
            source.fetch_keys(conn, walk, False)


def test_guard_topic_walk_and_fetch_agree_on_both_databases(both: Jms) -> None:
    """A topic: one handle per durable subscriber; the walk lists each once and fetch finds each."""
    for i in range(3):
        both.store(lambda c, t, i=i: openjms_message(c, t, f"ID:t-{i}", TOPIC_ID, blob("text_simple.bin"),
                                                    list(SUBSCRIBERS.values())))
    with both.source.connect() as conn:
        if both.source_schema:
            conn.execute(sa.text(f'SET search_path TO "{both.source_schema}"'))
        topic = both.runner().sources["prices.eu"]
        walk = list(topic.iter_keys(conn))
        assert len(walk) == 6 == topic.count_keys(conn) == len([k for k, _ in topic.iter_aged(conn)])
        assert [r.key for r in topic.fetch_keys(conn, walk, False)] == walk


@pytest.mark.parametrize("dialect", ["mssql", "mariadb", "sqlite"])
def test_guard_the_destination_subquery_renders_one_ordered_row(dialect: str) -> None:
    from sqlalchemy.dialects import mssql, mysql, sqlite

    d = {"mssql": mssql.dialect(), "mariadb": mysql.dialect(), "sqlite": sqlite.dialect()}[dialect]
    source = OpenJMSSource.__new__(OpenJMSSource)
    source.t, source.queue = tables(None), "orders"
    sql = " ".join(str(source._slice((1, "a"), (2, "b"), dialect).limit(10)
                       .compile(dialect=d, compile_kwargs={"literal_binds": True})).split())
    inner = sql[sql.index("= (SELECT"):]
    one = "SELECT TOP 1 destinations.destinationid" if dialect == "mssql" else "LIMIT 1"
    assert one in inner and "ORDER BY destinations.destinationid" in inner, sql
