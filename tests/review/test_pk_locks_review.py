"""Fresh-eyes review of feb6d77 and b525b57 (the books' locking statements by primary key on
MariaDB), with 2699054 for context.

Finding (a test that fails on the code as it stands):
- QuarantineDesk._entry, for a message quarantined under another source identity, now reads the
  entry's origin with a non-locking SELECT in the discard's own transaction before the
  SELECT ... FOR UPDATE. On InnoDB that consistent read opens the transaction's read view
  before the lock is taken. With innodb_snapshot_isolation=ON (the default from MariaDB 11.6.2,
  so 11.8 LTS; a session setting on 10.6.18+/10.11.8+), a locking read of a record that another
  transaction changed and committed after the view was opened fails with ER_CHECKREAD (1020,
  "Record has changed since last read"). Two operators discarding the same message (or group):
  the second's discard, which waited on the first's lock, now stops with that error instead of
  answering "not-quarantined"; before b525b57 the FOR UPDATE was the transaction's first
  statement and no view existed. The error is not one bridge.db retries.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.db import engine_for
from bridge.lifecycle.quarantine import QuarantineDesk
from bridge.timefmt import naive_utc, utcnow
from tests.review.test_mariadb_scan_locks_review import SYSTEM, _books, _Thread, quarantined_under_an_old_identity


def _locking_read_waits(engine: sa.Engine) -> bool:
    """Whether a SELECT ... FOR UPDATE of the ledger is running (waiting) in this database. A
    transaction that has done only consistent reads shows in innodb_trx as RUNNING while it waits
    on a lock (its primary-key lookup waits in the optimizer's const-table read: "Statistics")."""
    with engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "select count(*) from information_schema.processlist where db = database() and command = 'Execute' "
            "and info like 'SELECT%qbridge_ledger%FOR UPDATE'")).scalar_one())


@pytest.mark.mariadb
def test_a_second_discard_of_a_message_quarantined_under_another_identity_fails_under_snapshot_isolation(
        mariadb_database: str) -> None:
    engine, state = _books(mariadb_database)
    queue, job, key = "Q1", "job1", "m-0"
    old_origin, mid, at = quarantined_under_an_old_identity(engine, state, job, queue, key)

    # The desk's engine as on MariaDB 11.6.2+ (innodb_snapshot_isolation defaults to ON there).
    desk_engine = engine_for(mariadb_database)

    @sa.event.listens_for(desk_engine, "connect")
    def _snapshot_isolation(dbapi_conn: Any, _: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("SET SESSION innodb_snapshot_isolation = ON")
        cur.close()

    runner = SimpleNamespace(target_engine=desk_engine, state=state, database="db", sources={queue: object()},
                             job=SimpleNamespace(name=job, source=SimpleNamespace(system=SYSTEM)))
    desk = QuarantineDesk(runner, "bob", "bad bodies")  # type: ignore[arg-type]
    q = {"message_id": mid, "queue": queue, "source_key": key, "reason": "bad body", "raw": {}, "at": at.isoformat()}
    outcomes: list[Any] = []
    second = _Thread(lambda: outcomes.append(desk._discard_one(q)))

    # Alice's discard of the same message holds its entry (the statements _settle runs, in her
    # transaction); Bob's discard starts meanwhile and waits on her lock.
    l = state.ledger
    alice = engine.connect()
    tx = alice.begin()
    alice.execute(sa.select(l.c.outcome).where(l.c.origin == old_origin, l.c.source_key == key).with_for_update())
    second.start()
    deadline = time.monotonic() + 10
    while not _locking_read_waits(engine) and second.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    waits = _locking_read_waits(engine)
    alice.execute(sa.update(l).where(l.c.origin == old_origin, l.c.source_key == key)
                  .values(outcome="skipped", reason="discarded by alice", at=naive_utc(utcnow())))
    alice.execute(sa.delete(state.quarantine).where(state.quarantine.c.message_id == mid))
    tx.commit()
    alice.close()
    second.join(timeout=60)
    assert not second.is_alive()
    desk_engine.dispose()

    assert waits, "Bob's discard did not wait on Alice's lock"
    assert second.error is None, f"Bob's discard failed instead of finding the message settled: {second.error}"
    assert [o.action for o in outcomes] == ["not-quarantined"]
