"""Two jobs between the same two SQLite files, one each way, under one `qbridge run`: the demo's
nginn-orders (legacy -> NServiceBus) and nginn-replies (NServiceBus -> legacy, move mode), with
traffic both ways. A pass locks its source, then its target, each file whole; the other job's
pass locked them in the other order, each waited for the other until SQLite's 30 s busy timeout
failed both, and their equal back-offs met again (2026-11-29: two batches in a minute, and the
legacy writers waited 30 s). Now such passes first take an flock beside the lower-named file
(bridge.ledger.sqlite_order)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import orjson
import sqlalchemy as sa

from bridge.commands.main import main as cli_main
from bridge.demo.run import build
from bridge.demo.samples import nginn_row
from bridge.errors import RetryableError
from bridge.ledger.sqlite_order import sqlite_pass_order
from bridge.timefmt import to_wire, utcnow


def _reply(n: int) -> tuple[str, str, bytes]:
    headers = {"NServiceBus.MessageId": str(uuid.uuid4()), "NServiceBus.MessageIntent": "Reply",
               "NServiceBus.CorrelationId": f"corr-{n}", "NServiceBus.ConversationId": "c",
               "NServiceBus.EnclosedMessageTypes": "Orders.Messages.OrderAccepted, Orders.Messages",
               "NServiceBus.ContentType": "application/json", "NServiceBus.OriginatingEndpoint": "Orders",
               "NServiceBus.ReplyToAddress": "Orders",
               "NServiceBus.TimeSent": to_wire(utcnow())}
    return str(uuid.uuid4()), orjson.dumps(headers).decode(), b'{"OrderId":1}'


def test_jobs_each_way_between_two_sqlite_files_do_not_deadlock(tmp_path: Path) -> None:
    config = build(tmp_path)
    text = config.read_text().replace('schedule = { every = "5s" }', 'schedule = { every = "1s" }')
    config.write_text(text.replace('mode     = "move"\n', 'mode     = "move"\nschedule = { every = "1s" }\n'))
    assert cli_main(["init", "-c", str(config)]) == 0
    log = tmp_path / "run.log"
    run = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(config)], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=log.open("w"))
    legacy = sqlite3.connect(tmp_path / "legacy-nginn.db", timeout=60, isolation_level=None)
    nsb = sqlite3.connect(tmp_path / "nservicebus.db", timeout=60, isolation_level=None)
    fed, worst = 0, 0.0
    try:
        time.sleep(2)
        end = time.monotonic() + 10
        while time.monotonic() < end:  # both ways, as the two sides' endpoints keep sending
            fed += 1
            row = nginn_row("MQueue1", 10_000 + fed, datetime.now(), headers="_NG-ReplyTo=sql://db/Sender")
            started = time.monotonic()
            legacy.execute(f'insert into "MQueue1" ({", ".join(row)}) values ({", ".join("?" * len(row))})', list(row.values()))
            nsb.execute('insert into "Sales" (id, headers, body) values (?, ?, ?)', _reply(fed))
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # both jobs catch up
            left = nsb.execute('select count(*) from "Sales"').fetchone()[0]
            moved = nsb.execute('select count(*) from "Orders"').fetchone()[0]
            if left == 0 and moved >= fed:
                break
            time.sleep(0.5)
    finally:
        run.terminate()
        run.wait(60)
        legacy.close()
        nsb.close()
    out = log.read_text()
    assert "database is locked" not in out, out[-3000:]
    assert worst < 10, f"a legacy or NServiceBus writer waited {worst:.1f} s (the jobs held the files)\n{out[-3000:]}"
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'legacy-nginn.db'}")
    with engine.connect() as conn:
        replies = conn.execute(sa.text('select count(*) from "Sender" where correlation_id like \'corr-%\'')).scalar_one()
    engine.dispose()
    assert left == 0 and replies >= fed and moved >= fed, (fed, left, moved, replies, out[-2000:])


def test_the_order_lock_is_taken_only_between_two_sqlite_files(tmp_path: Path) -> None:
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    with sqlite_pass_order(a, "postgresql+psycopg://127.0.0.1/test"), sqlite_pass_order(a, a):
        assert not list(tmp_path.glob("*.lock"))
    with sqlite_pass_order(b, a):  # the lower-named file's, whichever way the pass goes
        assert [p.name for p in tmp_path.glob("*.lock")] == ["a.db.qbridge-pass.lock"]
        with sqlite_pass_order(a, b, wait=0.3):  # this thread holds it already: no second flock
            pass
        raised: list[BaseException] = []

        def other_pass() -> None:  # another thread: a flock of its own, which waits
            started = time.monotonic()
            try:
                with sqlite_pass_order(a, b, wait=0.3):
                    pass
            except RetryableError as e:
                raised.append(e)
            assert time.monotonic() - started >= 0.3

        t = threading.Thread(target=other_pass)
        t.start()
        t.join(10)
        assert len(raised) == 1 and "a.db.qbridge-pass.lock for 0 s" in str(raised[0]), raised
    with sqlite_pass_order(a, b, wait=0.3):  # released
        pass


def test_a_lock_file_that_cannot_be_opened_leaves_the_pass_unordered_not_failed(tmp_path: Path) -> None:
    """No descriptor to spare for a moment, or a directory qbridge cannot write: the pass goes on as
    before this lock, and SQLite says what is wrong with its own files (a shortage is retried there)."""
    entered = False
    with sqlite_pass_order(f"sqlite:///{tmp_path}/a-missing/x.db", f"sqlite:///{tmp_path}/b.db"):
        entered = True
    assert entered and not list(tmp_path.rglob("*.lock"))
