"""Review of `qbridge rollback` (issue 28): interleavings that lose or double a message."""

from __future__ import annotations

import pytest

from helpers import Bridge


def _second_job(b: Bridge, name: str, mode: str) -> None:
    """Another job of the same config reading the same NGinn queue into the same target."""
    text = b.config.read_text()
    job = text[text.index("[[jobs]]"):]
    b.config.write_text(text + "\n" + job.replace('name     = "job1"', f'name     = "{name}"')
                        .replace('mode     = "copy"', f'mode     = "{mode}"'))


@pytest.mark.postgres
def test_rollback_does_not_withdraw_what_another_job_reading_the_queue_delivered(make) -> None:
    """job2 (move mode) delivers MQueue1's messages and consumes them (I -> X); job1 (copy mode)
    reads the same queue and finds them in the shared ledger. The range ledger keeps no job:
    rollback of job1 took job2's messages out of Orders and their bits, and lowered job1's
    checkpoint only; job1's next pass read the rows as processed ('X' -> skip): five messages
    no endpoint ever got, gone from the target, 'skipped' in the books. Now refused."""
    b = make(batch_size=10)
    _second_job(b, "job2", "move")
    b.insert(b.ready(5))
    assert b.cli("sync", "--once", "--job", "job2") == 0
    assert set(b.subqueues().values()) == {"X"}
    before = b.message_ids("Orders")
    assert sum(before.values()) == 5
    assert b.cli("sync", "--once", "--job", "job1") == 0
    code = b.cli("rollback", "--yes", "--job", "job1")
    assert b.cli("sync", "--once", "--job", "job1") == 0
    assert b.message_ids("Orders") == before, f"rollback exited {code}; job2's messages are gone"
    assert code == 2  # refused, naming job2


@pytest.mark.postgres
def test_a_same_named_queue_of_another_legacy_database_does_not_refuse_rollback(make) -> None:
    """The refusal above is for the same queue only: job2 reads a queue of the same name under
    another source identity (another legacy database), so its messages have other origins."""
    b = make(batch_size=10)
    _second_job(b, "job2", "copy")
    text = b.config.read_text()
    head, tail = text.rsplit('database = "LegacyDb"', 1)
    b.config.write_text(head + 'database = "OtherDb"' + tail)
    b.insert(b.ready(5))
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 10
    assert b.cli("rollback", "--yes", "--job", "job1") == 0
    assert b.count("Orders") == 5  # job2's five stay
    assert b.cli("sync", "--once", "--job", "job1") == 0
    assert b.count("Orders") == 10 and len(b.message_ids("Orders")) == 10


@pytest.mark.postgres
def test_migrate_closing_pass_counts_the_passes_of_every_attempt(make, monkeypatch) -> None:
    """Retries follow progress (issue 29): migrate's closing pass is retried after passes that
    committed. Its summary took the stats of the last attempt only: rows delivered by earlier
    attempts were missing from what migrate printed."""
    from rich.console import Console

    from bridge.config import load_config
    from bridge.pipeline import spark
    from helpers import flaky_passes

    b = make(batch_size=10)
    b.insert(b.ready(300))
    runner = b.runner()
    flaky_passes(monkeypatch, 3, spark)
    runner.check()
    plan = spark.QueuePlan(runner, "MQueue1", None)  # no units: the closing pass does it all
    [total] = spark._run(load_config(b.config), [plan], [], Console(quiet=True), None, attempts=2)
    assert b.count("Orders") == 300
    assert total.delivered == 300
