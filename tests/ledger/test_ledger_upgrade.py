"""A ledger made by qbridge before it was keyed by (origin, source key): `qbridge init` converts
it in place, on PostgreSQL, MariaDB and SQLite, and what it held is still known afterwards (a
sync delivers only what it had not); every other command refuses it with what to do."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.errors import TargetSchemaError
from bridge.ledger.upgrade import NEW, OLD, QueueOrigin, convert, earlier_layout
from bridge.model import message_id_for, queue_origin
from bridge.ledger.state import ledger_table
from helpers import Bridge


def earlier_ledger(schema: str | None) -> sa.Table:
    """The ledger as qbridge made it before the origin key (its DDL then, verbatim)."""
    return sa.Table(
        "qbridge_ledger", sa.MetaData(),
        sa.Column("message_id", sa.String(36), primary_key=True),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("source_key", sa.String(200), nullable=False),
        sa.Column("outcome", sa.String(12), nullable=False),
        sa.Column("target", sa.String(260)),
        sa.Column("reason", sa.String(500)),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Index("ix_qbridge_ledger_job_queue", "job", "queue", "outcome"),
        schema=schema,
    )


def fill_earlier(engine: sa.Engine, schema: str | None, entries: dict[tuple[str, str], list[int]],
                 database: str = "LegacyDb") -> None:
    """Makes the earlier ledger with `entries` (job, queue) -> NGinn keys, delivered (every
    third one skipped), with the message ids that qbridge made then."""
    table = earlier_ledger(schema)
    with engine.begin() as conn:
        table.drop(conn, checkfirst=True)
        table.create(conn)
        for (job, queue), keys in entries.items():
            if not keys:
                continue
            conn.execute(table.insert(), [
                {"message_id": str(message_id_for("nginn", database, queue, str(k))), "job": job, "queue": queue,
                 "source_key": str(k), "outcome": "skipped" if k % 3 == 0 else "delivered",
                 "target": None if k % 3 == 0 else "Orders", "reason": "expired" if k % 3 == 0 else None,
                 "at": datetime(2026, 1, 2, 3, 4, 5)}
                for k in keys
            ])


def ledger_rows(engine: sa.Engine, schema: str | None) -> set[tuple]:
    t = ledger_table(schema)
    with engine.connect() as conn:
        return set(conn.execute(sa.select(t)).all())


def expected_rows(entries: dict[tuple[str, str], list[int]], database: str = "LegacyDb") -> set[tuple]:
    return {(queue_origin("nginn", database, queue), str(k), str(message_id_for("nginn", database, queue, str(k))), job,
             queue, "skipped" if k % 3 == 0 else "delivered", None if k % 3 == 0 else "Orders",
             "expired" if k % 3 == 0 else None, datetime(2026, 1, 2, 3, 4, 5))
            for (job, queue), keys in entries.items() for k in keys}


def tables(engine: sa.Engine, schema: str | None) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names(schema=schema))


ENTRIES = {("job1", "MQueue1"): list(range(1, 2501)), ("job1", "MQueue2"): [7, 8, 9], ("job2", "MQueue1"): []}
ORIGINS = [QueueOrigin("job1", "MQueue1", "nginn", "LegacyDb"), QueueOrigin("job1", "MQueue2", "nginn", "LegacyDb")]


def _convert_in_place(engine: sa.Engine, schema: str | None) -> None:
    fill_earlier(engine, schema, ENTRIES)
    said: list[str] = []
    assert convert(engine, schema, ORIGINS, "nsb", said.append) == 2503
    assert "2,503 entries of 2 queue(s)" in said[0]
    with engine.connect() as conn:
        assert not earlier_layout(conn, schema)
        keys = sa.inspect(conn).get_pk_constraint("qbridge_ledger", schema=schema)["constrained_columns"]
        indexes = sa.inspect(conn).get_indexes("qbridge_ledger", schema=schema)
    # The one index besides the key: entries by age, for pruning (bridge.lifecycle.prune).
    assert keys == ["origin", "source_key"] and [i["column_names"] for i in indexes] == [["origin", "at"]]
    assert ledger_rows(engine, schema) == expected_rows(ENTRIES)
    assert not {NEW, OLD} & tables(engine, schema)
    assert convert(engine, schema, ORIGINS, "nsb") is None  # once converted, init leaves it alone


def test_convert_on_postgresql(pg_server: str, pg_schema: str) -> None:
    _convert_in_place(sa.create_engine(pg_server), pg_schema)


def test_convert_on_mariadb(mariadb_database: str) -> None:
    _convert_in_place(sa.create_engine(mariadb_database), None)


def test_convert_on_sqlite(tmp_path: Path) -> None:
    _convert_in_place(sa.create_engine(f"sqlite:///{tmp_path}/n.db"), None)


@pytest.mark.parametrize("entries, database, said", [
    ({**ENTRIES, ("old-job", "Gone"): [1, 2]}, "LegacyDb",
     ["2 entries of job 'old-job' queue 'Gone', which this config does not have", "put that job and queue back"]),
    # Converted under today's identity they would be filed under the wrong origin: the queue's
    # messages would all look new and be delivered again.
    (ENTRIES, "OldName", ["2500 entries of job 'job1' queue 'MQueue1' were made under another source identity than "
                          "today's 'LegacyDb'", "set jobs[].source.database"]),
], ids=["queue-not-in-config", "another-source-identity"])
def test_entries_init_cannot_place_stop_the_conversion_and_change_nothing(
        pg_server: str, pg_schema: str, entries: dict, database: str, said: list[str]) -> None:
    engine = sa.create_engine(pg_server)
    fill_earlier(engine, pg_schema, entries, database=database)
    with pytest.raises(TargetSchemaError) as e:
        convert(engine, pg_schema, ORIGINS, "nsb")
    assert "nothing was changed" in str(e.value) and all(s in str(e.value) for s in said), str(e.value)
    with engine.connect() as conn:
        assert earlier_layout(conn, pg_schema)
    assert tables(engine, pg_schema) == {"qbridge_ledger"}
    assert len(ledger_rows_earlier(engine, pg_schema)) == sum(len(k) for k in entries.values())


def ledger_rows_earlier(engine: sa.Engine, schema: str | None) -> list:
    with engine.connect() as conn:
        return conn.execute(sa.select(earlier_ledger(schema))).all()


def test_a_conversion_cut_off_between_mariadbs_renames_is_finished(mariadb_database: str) -> None:
    """MariaDB commits each rename by itself: a process killed between them leaves the old ledger
    renamed aside and the complete copy not yet in place; the next init puts it there."""
    engine = sa.create_engine(mariadb_database)
    fill_earlier(engine, None, ENTRIES)
    new = ledger_table(None, name=NEW)
    with engine.begin() as conn:
        new.create(conn)
        for o in ORIGINS:
            for k in ENTRIES[(o.job, o.queue)]:
                conn.execute(new.insert().values(
                    origin=o.origin, source_key=str(k), message_id=str(message_id_for("nginn", "LegacyDb", o.queue, str(k))),
                    job=o.job, queue=o.queue, outcome="skipped" if k % 3 == 0 else "delivered",
                    target=None if k % 3 == 0 else "Orders", reason="expired" if k % 3 == 0 else None,
                    at=datetime(2026, 1, 2, 3, 4, 5)))
        conn.execute(sa.text(f"ALTER TABLE qbridge_ledger RENAME TO {OLD}"))
    assert convert(engine, None, ORIGINS, "nsb") is None
    assert tables(engine, None) == {"qbridge_ledger"}
    assert ledger_rows(engine, None) == expected_rows(ENTRIES)


def test_init_converts_and_sync_delivers_only_what_the_earlier_ledger_did_not_have(make) -> None:
    b: Bridge = make()
    b.insert(b.ready(10))
    engine, schema = b.target, b.target_schema
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{schema}".qbridge_ledger'))
    fill_earlier(engine, schema, {("job1", "MQueue1"): [1, 2, 3, 4]})
    # the checkpoint of a job that had read none: the 4 entries must keep the sync from delivering those again
    assert b.cli("sync", "--once") == 2  # an earlier ledger is refused, with what to do
    assert b.count("Orders") == 0
    assert b.cli("init") == 0
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 6
    assert sorted(int(r["headers"]["QBridge.Source"].rsplit("/", 1)[1]) for r in b.rows("Orders")) == [5, 6, 7, 8, 9, 10]
    assert b.ledger() == {"delivered": 9, "skipped": 1}


def test_every_command_refuses_an_earlier_ledger_with_what_to_do(make, capsys: pytest.CaptureFixture[str]) -> None:
    b: Bridge = make()
    engine, schema = b.target, b.target_schema
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{schema}".qbridge_ledger'))
    fill_earlier(engine, schema, {("job1", "MQueue1"): [1]})
    capsys.readouterr()
    for command in (["sync", "--once"], ["verify"], ["status"]):
        assert b.cli(*command) != 0, command
        said = capsys.readouterr().err
        assert "made by an earlier qbridge (keyed by message id)" in said and "run `qbridge init -c CONFIG` once" in said, said


def test_print_sql_shows_the_conversion_for_a_dba(make, capsys: pytest.CaptureFixture[str]) -> None:
    b: Bridge = make()
    capsys.readouterr()
    assert b.cli("init", "--print-sql") == 0
    sql = capsys.readouterr().out
    origin = queue_origin("nginn", "LegacyDb", "MQueue1")
    assert f"BEGIN;\n\nLOCK TABLE {b.target_schema}.qbridge_ledger IN EXCLUSIVE MODE" in sql
    assert f"SELECT {origin} AS anon_1" in sql and "WHERE" in sql and "'job1'" in sql
    assert f"ALTER TABLE {b.target_schema}.qbridge_ledger_new RENAME TO qbridge_ledger;\n\nDROP TABLE {b.target_schema}.qbridge_ledger_old;\n\nCOMMIT" in sql
