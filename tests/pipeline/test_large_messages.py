"""Large messages move intact: a 50 MB body and a message with 10,000 headers, on PostgreSQL."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bridge.demo.samples import nginn_body, nginn_row
from helpers import Bridge

pytestmark = pytest.mark.slow


def test_a_50_mb_body_and_10000_headers_arrive_intact(tmp_path: Path, pg_server: str, pg_schema: str) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, batch_size=2)
    assert b.cli("init") == 0
    now = b.now_local()
    big = nginn_body("Orders.PlaceOrder, Orders", Blob="x" * (50 * 2**20), Tail="ż")
    many = "|".join(f"Custom-{i}=value {i}" for i in range(10_000))
    b.insert([nginn_row("MQueue1", 1, now, body=big), nginn_row("MQueue1", 2, now, headers=many),
              nginn_row("MQueue1", 3, now)])
    assert b.cli("sync", "--once") == 0
    rows = {r["headers"]["NGinn.BusMessageId"]: r for r in b.rows("Orders")}
    assert len(rows) == 3
    assert hashlib.sha256(rows["1"]["body"]).hexdigest() == hashlib.sha256(big.encode()).hexdigest()
    headers = rows["2"]["headers"]
    assert all(headers[f"Custom-{i}"] == f"value {i}" for i in range(10_000))
    assert b.cli("verify", "--deep") == 0
    b.dispose()


def test_batch_size_1_moves_every_row_exactly_once_on_spark_and_in_process(make) -> None:
    """The 1M-row run was a probe since removed (docs/benchmarks.md); here the same settings on a few hundred rows, with holes."""
    import sqlalchemy as sa

    b = make(batch_size=1)
    b.insert(b.ready(300))
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:
        conn.execute(t.delete().where(t.c.id % 7 == 0))
    proc = b.spawn("migrate", "--unit-rows", "60")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    b.insert(b.ready(40, start=1000))
    assert b.cli("sync", "--once") == 0
    with b.source.connect() as conn:
        left = conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
    ids = b.message_ids("Orders")
    assert len(ids) == left and set(ids.values()) == {1}
    assert b.cli("verify") == 0
