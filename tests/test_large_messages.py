"""Large messages move intact: a 50 MB body and a message with 10,000 headers, on PostgreSQL."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bridge.samples import nginn_body, nginn_row
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
