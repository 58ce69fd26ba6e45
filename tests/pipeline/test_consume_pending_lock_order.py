"""A third review of issue 25's exactly-once machinery (724b536, with b1804b7's totals and
310ffa1's pruning): lock order between a pass and `_consume_pending`.

A pass takes its locks source first, target second (`_in_source_tx` begins the source, then
`_pass` locks the checkpoint). Since 724b536, `_consume_pending` takes them the other way round:
the checkpoint's target transaction first, then a source transaction inside it. On PostgreSQL and
MariaDB a pass's source transaction holds no row before it has the checkpoint, so the two never
meet. On SQLite every transaction takes the database's write lock at BEGIN (db._sqlite_immediate),
so the source lock is held from `sconn.begin()`: two jobs of one `qbridge run` (its scheduler runs
jobs in threads) that share the legacy file and the target file wait on each other until SQLite's
busy timeout, and both passes fail with "database is locked".
"""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from helpers import MAPPING, TZ

from bridge import faults
from bridge.commands.main import main as cli_main
from bridge.config import load_config
from bridge.db import engine_for
from bridge.demo.samples import create_nginn_queue, nginn_row
from bridge.pipeline.loop import JobRunner


class Died(Exception):
    """A pass cut off where a test says (its connection dropped at that point)."""

def dies_before_its_source_commit(monkeypatch: pytest.MonkeyPatch, runner: JobRunner, queue: str) -> None:
    """`runner`'s pass of `queue` delivers and dies before its source commit: its keys stay pending."""
    real = faults.reached

    def dying(point: str) -> None:
        if point == "after_target_commit":
            raise Died("the source connection dropped at the commit")
        real(point)

    monkeypatch.setattr(faults, "reached", dying)
    with pytest.raises(Died):
        runner.run_pass(queue)
    monkeypatch.setattr(faults, "reached", real)



def _two_jobs_on_sqlite(tmp: Path) -> tuple[str, str, Path]:
    """Two move-mode jobs (one NGinn queue each) on one legacy SQLite file and one target file."""
    source, target = f"sqlite:///{tmp / 'legacy.db'}", f"sqlite:///{tmp / 'nsb.db'}"
    (tmp / "mapping.toml").write_text(MAPPING)
    jobs = "".join(f"""
[[jobs]]
name     = "job{i}"
source   = {{ system = "nginn", connection = "legacy", queues = ["MQueue{i}"], timezone = "{TZ}", database = "LegacyDb" }}
target   = {{ connection = "nsb", flavor = "postgresql" }}
mapping  = "mapping.toml"
mode     = "move"
batch_size = 100
""" for i in (1, 2))
    config = tmp / "bridge.toml"
    config.write_text(f'[connections]\nlegacy = "{source}"\nnsb    = "{target}"\n{jobs}')
    return source, target, config


# Failed on 724b536: _consume_pending locked the target, then the source; a pass the source, then
# the target. On SQLite two jobs sharing the files waited on each other until the busy timeout.
def test_consume_pending_and_another_jobs_pass_do_not_wait_on_each_other_sqlite(tmp_path: Path, monkeypatch) -> None:
    source_url, target_url, config_path = _two_jobs_on_sqlite(tmp_path)
    src = sa.create_engine(source_url)
    tables = {q: create_nginn_queue(src, q, None) for q in ("MQueue1", "MQueue2")}
    assert cli_main(["init", "-c", str(config_path)]) == 0
    now = datetime.now(ZoneInfo(TZ)).replace(tzinfo=None, microsecond=0)
    with src.begin() as conn:
        for q, t in tables.items():
            conn.execute(t.insert(), [nginn_row(q, i, now, headers="Tenant=acme") for i in range(1, 6)])
    src.dispose()

    # A short busy timeout instead of qbridge's 30 s, so that the wait shows in seconds, not half a minute.
    for url in (source_url, target_url):
        engine = engine_for(url)
        sa.event.listen(engine, "connect", lambda dbapi, _rec: dbapi.execute("PRAGMA busy_timeout = 3000"))
        engine.dispose()

    config = load_config(config_path)
    one, two = JobRunner(config, config.job("job1")), JobRunner(config, config.job("job2"))

    # job2's pass delivers MQueue2 and dies before its source commit: 5 keys pending.
    dies_before_its_source_commit(monkeypatch, two, "MQueue2")

    # job1's pass has begun its source transaction (SQLite: the legacy file's write lock) when
    # job2's next pass, in another scheduler thread, locks its checkpoint to consume those keys.
    in_source, checkpoint_locked = threading.Event(), threading.Event()
    pass_one, lock_two = one._pass, two.state.lock_checkpoint

    def pass_after_the_other_locked(*args, **kwargs):
        in_source.set()
        checkpoint_locked.wait(1)  # under the busy timeout: a job2 that cannot lock it waits on this pass instead
        return pass_one(*args, **kwargs)

    def lock_and_tell(*args, **kwargs):
        cp = lock_two(*args, **kwargs)
        checkpoint_locked.set()
        return cp

    monkeypatch.setattr(one, "_pass", pass_after_the_other_locked)
    monkeypatch.setattr(two.state, "lock_checkpoint", lock_and_tell)
    errors: list[BaseException] = []

    def run(runner: JobRunner, queue: str, first: threading.Event | None) -> None:
        try:
            if first is not None:
                first.wait(10)
            runner.run_pass(queue)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(one, "MQueue1", None)),
               threading.Thread(target=run, args=(two, "MQueue2", in_source))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, f"the passes waited on each other: {[f'{type(e).__name__}: {e}'[:120] for e in errors]}"
    with sa.create_engine(source_url).connect() as conn:
        for q, t in tables.items():
            assert dict(conn.execute(sa.select(t.c.subqueue, sa.func.count()).group_by(t.c.subqueue)).all()) == {"X": 5}, q
