"""A review of f9a76a1 (NGinn's ledger as ranges): interleavings and upgrade paths that could
lose or double a message, or make verify lie.

Since f9a76a1 a delivered or skipped NGinn message has a bit and no per-message entry, and a
Spark unit's first attempt looks nothing up: the bits' conflict check is all that stops it from
delivering a message again. Every entry of an earlier per-message ledger must therefore become a
bit before any command runs against it; `init` folds only the queues of the config it is given,
and once it has renamed the range ledger into place nothing ever folds the rest.
"""

from __future__ import annotations

import sqlalchemy as sa

from bridge.demo.samples import nginn_row
from helpers import unfold_ranges


def test_init_never_leaves_nginn_entries_of_a_queue_missing_from_its_config_unfolded(make, capsys) -> None:
    """An earlier qbridge delivered MQueue2 (a migration cut off: its checkpoint never moved).
    After the upgrade, `qbridge init` is first run with a config without MQueue2 (another config
    file shares the target, or the queue was taken out for a while): it must not fold the ledger
    then, for once the range ledger is in place every command trusts it, and a later init does
    nothing. The migration run again would deliver every message of MQueue2 a second time: its
    first attempt trusts the bits, and MQueue2's messages have entries but no bits."""
    b = make(queues=["MQueue1", "MQueue2"], batch_size=50)
    now = b.now_local()
    b.insert([nginn_row("MQueue1", i, now) for i in range(1, 11)])
    ids = b.insert([nginn_row("MQueue2", i, now) for i in range(1, 31)], queue="MQueue2")
    first = b.runner()
    first.check()
    first.run_range("MQueue2", ids[0] - 1, ids[-1])  # a Spark unit: the checkpoint stays where it was
    assert b.count("Billing") == 30
    assert unfold_ranges(b) == 30  # as an earlier qbridge left it: an entry per message

    b.queues = ["MQueue1"]
    b.write_config()
    without = b.cli("init")
    b.queues = ["MQueue1", "MQueue2"]
    b.write_config()
    assert b.cli("init") == 0
    capsys.readouterr()

    again = b.runner()  # the migration run again: a new process, each unit's first attempt optimistic
    again.check()
    result = again.run_range("MQueue2", ids[0] - 1, ids[-1])
    assert b.count("Billing") == 30, "MQueue2's messages were delivered a second time"
    assert (result.stats.delivered, result.stats.already) == (0, 30)
    assert without != 0  # refused, nothing changed: MQueue2's entries are not this config's
    with b.target.connect() as conn:
        entries = conn.execute(sa.text(f"select count(*) from {b._qualified('qbridge_ledger')}")).scalar_one()
    assert entries == 0 and b.ledger() == {"delivered": 30}
    assert b.cli("verify") == 0


def test_verify_deep_does_not_call_a_message_still_in_the_target_consumed(tmp_path) -> None:
    """A range keeps no target table, so `verify --deep` maps the source row again to find where
    its message went. A row that no longer maps (its legacy row deleted by a cleanup, or changed
    so that it no longer decodes) names no table; when no other row names that table either, it
    is not read at all, and messages sitting in it were counted as consumed by an endpoint,
    with exit 0. They are there, and differ from what their rows make today: mismatched."""
    from tests.lifecycle.test_verify_deep import verify_json

    from helpers import Bridge

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    ids = b.insert(b.ready(2))
    assert b.cli("sync", "--once") == 0
    code, doc = verify_json(b, "--deep")
    assert code == 0 and doc["jobs"][0]["queues"][0]["deep"]["matched"] == 2
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:  # legacy cleanup took one row; someone broke the other
        conn.execute(t.delete().where(t.c.id == ids[0]))
        conn.execute(t.update().where(t.c.id == ids[1]).values(subqueue="Z"))
    assert b.count("Orders") == 2
    code, doc = verify_json(b, "--deep")
    deep = doc["jobs"][0]["queues"][0]["deep"]
    assert deep["consumed"] == 0, deep
    assert deep["mismatched"] == 2 and code == 1
    assert sorted(deep["mismatched_keys"]) == sorted([f"{ids[0]} (no longer in the source)", str(ids[1])])
    b.dispose()


def test_a_range_ledger_created_beside_an_unfolded_ledger_is_no_proof_of_a_fold(make) -> None:
    """A DBA given `qbridge init --print-sql` creates the missing qbridge_ledger_ranges from its
    DDL (qbridge itself may not create tables there): the ledger's NGinn entries are not folded.
    Commands must keep refusing, and `qbridge init` must still fold them; else a Spark unit's
    first attempt, which trusts the bits, delivers every such message again."""
    b = make(batch_size=50)
    now = b.now_local()
    ids = b.insert([nginn_row("MQueue1", i, now) for i in range(1, 31)])
    first = b.runner()
    first.check()
    first.run_range("MQueue1", ids[0] - 1, ids[-1])  # a cut-off migration's unit: no checkpoint moved
    assert b.count("Orders") == 30
    assert unfold_ranges(b) == 30
    runner = b.runner()
    runner.state.ranges.table.create(runner.target_engine)  # the DBA, from the printed DDL
    refused = b.cli("status")
    assert b.cli("init") == 0

    again = b.runner()
    again.check()
    result = again.run_range("MQueue1", ids[0] - 1, ids[-1])
    assert b.count("Orders") == 30, "the messages were delivered a second time"
    assert (result.stats.delivered, result.stats.already) == (0, 30)
    assert refused == 2  # the books need `init` first: waiting cannot fix it
    assert b.ledger() == {"delivered": 30}
    assert b.cli("verify") == 0
