"""A replay or discard of a large group leaves the totals folded (the months-of-running rule): each
message settled adds its moves as totals rows in its own transaction, and only a pass of the queue
folded them, every FOLD_EVERY passes. A job that is stopped, runs once a day, or whose queue is
quiet kept three rows a message settled: 3,000,000 after a million, summed by every `status`,
scrape and page view, and read whole into memory by the fold that came at last."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from bridge.lifecycle import quarantine
from helpers import MAPPING, Bridge
from tests.lifecycle.test_quarantine_groups import NO_CATCH_ALL, seed


def _totals_rows(b: Bridge) -> int:
    with b.target.connect() as conn:
        return conn.execute(sa.text(f'select count(*) from "{b.target_schema}".qbridge_totals')).scalar_one()


@pytest.mark.postgres
def test_a_replay_and_a_discard_of_groups_over_a_page_leave_the_totals_folded(make, monkeypatch) -> None:
    monkeypatch.setattr(quarantine, "PAGE", 40)  # pages of 40 (the commands run in this process): 100 messages are three
    n = 100
    b: Bridge = make(queues=["MQueue1", "MQueue3"], mapping=NO_CATCH_ALL, batch_size=2000)
    seed(b, "MQueue3", n)  # no route: quarantined, replayed once the route exists
    seed(b, "MQueue1", n, body="{not json")  # not JSON: quarantined, discarded
    assert b.cli("sync", "--once") == 0
    assert b.ledger()["quarantined"] == 2 * n
    before = _totals_rows(b)

    b.mapping = MAPPING
    b.write_config()
    assert b.cli("init") == 0
    assert b.cli("quarantine", "replay", "--queue", "MQueue3") == 0
    assert b.cli("quarantine", "discard", "--queue", "MQueue1", "--why", "bad bodies") == 0
    assert b.ledger() == {"delivered": n, "skipped": n}
    # One row per queue and outcome (delivered, skipped, quarantined at 0, released), not three a message.
    after = _totals_rows(b)
    assert after <= before + 8, f"{after} totals rows after settling {2 * n:,} messages (were {before})"
    # and the folded totals still say what the ledger says (verify compares them)
    assert b.cli("verify") == 0
    runner = b.runner()
    with b.target.connect() as conn:
        counts = runner.state.counts(conn, "job1", runner.origins.values())
    assert (counts["MQueue3"]["delivered"], counts["MQueue3"]["quarantined"], counts["MQueue3"]["released"]) == (n, 0, n)
    assert (counts["MQueue1"]["skipped"], counts["MQueue1"]["quarantined"], counts["MQueue1"]["released"]) == (n, 0, n)
