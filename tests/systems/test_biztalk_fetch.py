"""How a BizTalk batch is fetched and read (issue 49): by the work queue's key on PostgreSQL (with
a batch's message ids as an IN list, the planner costed each probe as a random disk read and read
the whole queue instead, every batch: 100k entries, 6.7 ms a 500-id statement, 2.1 by the key),
its bytes as binary rows, and its headers' names from a cache the mapping's namespaces reset."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from bridge.config import load_config
from bridge.demo.samples import biztalk_store
from bridge.sources.biztalk import BizTalkSource

HOST = "BizTalkServerApplication"
FIX = Path(__file__).parents[1] / "fixtures" / "biztalk"


def make_source(tmp_path: Path, url: str, schema: str | None, engine: sa.Engine) -> BizTalkSource:
    (tmp_path / "mapping.toml").write_text('[routes]\n"*" = "Orders"\n')
    schema_line = f', schema = "{schema}"' if schema else ""
    (tmp_path / "bt.toml").write_text(f"""
[connections]
bt = "{url}"
[[jobs]]
name = "bt"
source = {{ system = "biztalk", connection = "bt", queues = ["{HOST}"]{schema_line}, timezone = "UTC" }}
target = {{ connection = "bt", flavor = "postgresql"{schema_line} }}
mapping = "mapping.toml"
""")
    return BizTalkSource(load_config(tmp_path / "bt.toml").jobs[0], engine, HOST, "MessageBox")


def test_a_batch_is_fetched_by_the_queues_key_not_by_reading_the_queue(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    engine = sa.create_engine(pg_server)
    biztalk_store(engine, [HOST], pg_schema)
    q = f'"{pg_schema}"."{HOST}Q"'
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO {q} SELECT gen_random_uuid(), gen_random_uuid() FROM generate_series(1, 100000)")
        conn.exec_driver_sql(f"ANALYZE {q}")
        rows = conn.exec_driver_sql(f'SELECT "uidMessageID", "uidInstanceID" FROM {q} ORDER BY 1, 2 OFFSET 50000 LIMIT 1000').all()
    keys = [f"Q:{m}:{i}" for m, i in rows]
    source = make_source(tmp_path, pg_server, pg_schema, engine)
    plans: list[str] = []

    def explain(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if f'"{HOST}Q" LEFT OUTER JOIN' in statement:  # the entries' statement, with the fetch's setting in force
            with cursor.connection.cursor() as c:
                c.execute("EXPLAIN " + statement, parameters)
                plans.append("\n".join(r[0] for r in c.fetchall()))

    sa.event.listen(engine, "before_cursor_execute", explain)
    try:
        with engine.begin() as conn:
            before = conn.exec_driver_sql("SHOW random_page_cost").scalar()
            fetched = source.fetch_keys(conn, keys, False)
            assert conn.exec_driver_sql("SHOW random_page_cost").scalar() == before
    finally:
        sa.event.remove(engine, "before_cursor_execute", explain)
        engine.dispose()
    assert [r.key for r in fetched] == keys  # no Spool rows here: each entry comes, to be quarantined
    assert len(plans) == 1, plans  # one statement for the batch, not one per 500 ids
    assert f'Seq Scan on "{HOST}Q"' not in plans[0] and f"{HOST}Q_pkey" in plans[0], plans[0][:2000]


def test_header_names_follow_the_namespaces_of_the_mapping_in_force(tmp_path: Path) -> None:
    """The names are cached by (namespace, property); a reload's mapping names them anew."""
    source = make_source(tmp_path, f"sqlite:///{tmp_path}/bt.db", None, sa.create_engine(f"sqlite:///{tmp_path}/bt.db"))
    bag = (FIX / "ctx_receive.bin").read_bytes()

    def mapping(namespaces: dict[str, str]) -> Any:
        return SimpleNamespace(biztalk=SimpleNamespace(namespaces=namespaces, message_type_property_id=None))

    ns = "http://example.org/orders/properties"
    source.configure(mapping({ns: "Orders"}))
    first = source.context(bag)[0]
    assert first["Orders.CustomerName"].startswith("Zoë") and first["Orders.IsRush"] == "false"
    assert source.context(bag)[0] == first  # from the cache
    source.configure(mapping({ns: "Sales"}))
    again = source.context(bag)[0]
    assert "Orders.CustomerName" not in again and again["Sales.CustomerName"] == first["Orders.CustomerName"]
    assert again["Sales.IsRush"] == "false"


def test_a_key_spelled_otherwise_is_fetched_under_the_key_given(tmp_path: Path) -> None:
    """Rows are matched to the batch's keys by text; a key not spelled as the walk spells it (in
    capitals, say) is spelled anew and its row still comes, under the key given."""
    from bridge.demo.samples import biztalk_message

    url = f"sqlite:///{tmp_path}/bt.db"
    engine = sa.create_engine(url)
    t = biztalk_store(engine, [HOST])
    context, part = (FIX / "ctx_receive.bin").read_bytes(), (FIX / "part_small_compressed.bin").read_bytes()
    with engine.begin() as conn:
        ids = [biztalk_message(conn, t, context, [("body", [part], 2146)], host=HOST) for _ in range(3)]
    source = make_source(tmp_path, url, None, engine)
    keys = [f"Q:{m}:{i}" for m, i in ids]
    asked = ["Q" + keys[0].upper()[1:], keys[1], keys[2]]
    with engine.connect() as conn:
        rows = source.fetch_keys(conn, asked, False)
    assert [r.key for r in rows] == [asked[0], keys[1], keys[2]]
    assert [r.values["uidMessageID"] for r in rows] == [m for m, _ in ids]
    assert all(len(r.values["parts"]) == 1 for r in rows)
    engine.dispose()


def test_a_messagebox_on_mariadb_is_refused_saying_why(mariadb_database: str, pg_server: str, pg_schema: str,
                                                        tmp_path: Path, capsys: Any) -> None:
    """MariaDB returns uuid columns with their bytes reordered: no entry matched its key, and a
    sync moved nothing and exited 0 (the first review of session 7). The job now stops on it."""
    from tests.systems.test_biztalk_source import SMALL, BizTalk, fx

    b = BizTalk(tmp_path, mariadb_database, pg_server, target_schema=pg_schema, system="biztalk", queues=[HOST],
                mapping='[routes]\n"*" = "Orders"\n')
    b.seed()
    assert b.cli("init") == 0
    b.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
    capsys.readouterr()
    assert b.cli("sync", "--once") == 2
    err = capsys.readouterr().err
    assert "BizTalk MessageBox on MariaDB is not supported" in err and "PostgreSQL" in err, err
    assert b.count("Orders") == 0 and b.count_rows(f"{HOST}Q") == 1
    b.dispose()
