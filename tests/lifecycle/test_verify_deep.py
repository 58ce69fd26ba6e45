"""`verify` per queue: skipped by rule; `--deep`: content of delivered messages against the source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import sqlalchemy as sa

from bridge.demo.samples import nginn_row
from helpers import Bridge


def verify_json(b: Bridge, *args: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "bridge", "verify", "-c", str(b.config), "--json", *args],
                       capture_output=True, text=True)
    return r.returncode, orjson.loads(r.stdout)


def test_verify_deep_finds_changed_content_and_counts_consumed_rows(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    now = b.now_local()
    b.insert(b.ready(6) + [nginn_row("MQueue1", 9, now, subqueue="X"), nginn_row("MQueue1", 10, now, subqueue="F", error_info="")])
    assert b.cli("sync", "--once") == 0

    code, doc = verify_json(b, "--deep")
    [q] = doc["jobs"][0]["queues"]
    assert code == 0 and q["balanced"]
    assert q["skipped_by_rule"] == {"state processed -> skip": 1}
    assert q["deep"] == {"compared": 7, "matched": 7, "mismatched": 0, "consumed": 0, "moved": 0, "impure": 0, "mismatched_keys": []}

    with b.target.begin() as conn:  # an endpoint consumed two messages; someone edited one body
        ids = conn.execute(sa.text('select id from "Orders" order by seq')).scalars().all()
        conn.execute(sa.text('delete from "Orders" where id in (:a, :b)'), {"a": ids[0], "b": ids[1]})
        conn.execute(sa.text('update "Orders" set body = :body where id = :id'), {"body": b"tampered", "id": ids[2]})
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:  # and the legacy row of another one changed after delivery
        conn.execute(t.update().where(t.c.id == 5).values(msg_text='{"$type":"Orders.PlaceOrder, Orders","Id":555}'))

    code, doc = verify_json(b, "--deep")
    [q] = doc["jobs"][0]["queues"]
    assert code == 1 and not q["balanced"]
    assert q["deep"]["consumed"] == 2 and q["deep"]["compared"] == 5 and q["deep"]["mismatched"] == 2
    assert sorted(q["deep"]["mismatched_keys"]) == ["3", "5"]
    code, _ = verify_json(b)  # without --deep the books still balance
    assert code == 0
    b.dispose()


def test_verify_deep_of_a_move_mode_job_says_its_legacy_rows_were_consumed_not_that_they_differ(tmp_path: Path) -> None:
    """Move mode consumed every row it delivered (NGinn's 'X'): the row says what it became, not
    what it was. Before, every delivered message of a move-mode job was reported as differing."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", mode="move")
    assert b.cli("init") == 0
    b.insert(b.ready(6))
    assert b.cli("sync", "--once") == 0
    code, doc = verify_json(b, "--deep")
    [q] = doc["jobs"][0]["queues"]
    assert code == 0 and q["balanced"], q
    assert q["deep"] == {"compared": 0, "matched": 0, "mismatched": 0, "consumed": 0, "moved": 6, "impure": 0, "mismatched_keys": []}
    b.dispose()
