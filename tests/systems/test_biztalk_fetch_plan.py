"""A BizTalk batch is fetched by the work queue's key on PostgreSQL (issue 49): with a batch's
message ids as an IN list, the planner costed each probe as a random disk read and read the whole
queue instead, every batch (100k entries: 6.7 ms a 500-id statement, 2.1 by the key). The fetch
sends the ids as one text and costs its probes as the neighbours they are, for its own statements
only."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from bridge.config import load_config
from bridge.demo.samples import biztalk_store
from bridge.sources.biztalk import BizTalkSource

HOST = "BizTalkServerApplication"


def test_a_batch_is_fetched_by_the_queues_key_not_by_reading_the_queue(pg_server: str, pg_schema: str, tmp_path) -> None:
    engine = sa.create_engine(pg_server)
    biztalk_store(engine, [HOST], pg_schema)
    q = f'"{pg_schema}"."{HOST}Q"'
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO {q} SELECT gen_random_uuid(), gen_random_uuid() FROM generate_series(1, 100000)")
        conn.exec_driver_sql(f"ANALYZE {q}")
        rows = conn.exec_driver_sql(f'SELECT "uidMessageID", "uidInstanceID" FROM {q} ORDER BY 1, 2 OFFSET 50000 LIMIT 1000').all()
    keys = [f"Q:{m}:{i}" for m, i in rows]
    (tmp_path / "mapping.toml").write_text('[routes]\n"*" = "Orders"\n')
    (tmp_path / "bt.toml").write_text(f"""
[connections]
bt = "{pg_server}"
[[jobs]]
name = "bt"
source = {{ system = "biztalk", connection = "bt", queues = ["{HOST}"], schema = "{pg_schema}", timezone = "UTC" }}
target = {{ connection = "bt", flavor = "postgresql", schema = "{pg_schema}" }}
mapping = "mapping.toml"
""")
    job = load_config(tmp_path / "bt.toml").jobs[0]
    source = BizTalkSource(job, engine, HOST, "MessageBox")
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
