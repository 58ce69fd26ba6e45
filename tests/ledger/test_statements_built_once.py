"""The statements every pass makes on the books (the checkpoint locked and saved, the give-back
and steering reads, the fence, the range rows, the ledger lookup) and its NGinn read are built once a table and job, their values bound
as parameters: building a SQLAlchemy statement anew cost ~0.2 ms, a dozen a pass (issue 49,
session 17). The SQL is what it was: the same rows are locked, read and written."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql, mysql, postgresql, sqlite

from bridge.demo.samples import nginn_row
from bridge.ledger import fence, giveback, ledger_lookup, ranges, state, steering
from bridge.sources import nginn

QUEUE = "MQueue1"
BUILT_ONCE = (state._lock_statement, state._save_statement, fence._statement, giveback._owed_statement,
              steering._read_statement, ranges._blocks_statement, ranges._update_statement, ledger_lookup._by_text,
              nginn._after_statement)


def _misses() -> list[int]:
    return [f.cache_info().misses for f in BUILT_ONCE]


def test_a_drain_builds_its_books_statements_once_and_moves_each_row_once(make: Any) -> None:
    b = make(batch_size=10)
    now = b.now_local()
    b.insert([nginn_row(QUEUE, i, now) for i in range(1, 41)])
    runner = b.runner()
    passes: list[Any] = []
    # the first two passes build them (the second updates the range row the first inserted)
    runner.drain(QUEUE, passes.append, should_stop=lambda: len(passes) >= 2)
    assert [p.delivered for p in passes] == [10, 10]
    built = _misses()
    hits = {f: f.cache_info().hits for f in BUILT_ONCE}
    runner.drain(QUEUE, passes.append)
    assert sum(p.delivered for p in passes) == 40
    assert _misses() == built  # nothing built again
    used = (state._lock_statement, state._save_statement, steering._read_statement, ranges._blocks_statement,
            ranges._update_statement, ledger_lookup._by_text, nginn._after_statement)
    assert all(f.cache_info().hits > hits[f] for f in used)
    assert b.count("Orders") == 40 and b.ledger() == {"delivered": 40}
    assert b.cli("verify") == 0


@pytest.mark.parametrize("dialect", [postgresql.dialect(), mysql.dialect(), sqlite.dialect(), mssql.dialect()],
                         ids=["postgresql", "mysql", "sqlite", "mssql"])
def test_the_statements_built_once_lock_what_they_locked(dialect: Any) -> None:
    md = sa.MetaData()
    from bridge.ledger.fence import jobs_table
    from bridge.ledger.ranges import ranges_table

    jobs, blocks = jobs_table(None, md), ranges_table(None, md)
    locked = str(fence._statement(jobs, "orders").compile(dialect=dialect))
    read = str(ranges._blocks_statement(blocks, True).compile(dialect=dialect))
    plain = str(ranges._blocks_statement(blocks, False).compile(dialect=dialect))
    if dialect.name == "mssql":
        assert "WITH (HOLDLOCK, ROWLOCK)" in locked and "WITH (UPDLOCK, ROWLOCK)" in read
        assert "UPDLOCK" not in plain
    elif dialect.name in ("postgresql", "mysql"):
        assert ("FOR SHARE" in locked or "LOCK IN SHARE MODE" in locked) and read.rstrip().endswith("FOR UPDATE")
        assert "FOR UPDATE" not in plain
    assert "ORDER BY" in read and "IN (" in read
