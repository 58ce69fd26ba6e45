"""A replay or discard writes its audit row under a savepoint only where some text is not ASCII
(bridge/lifecycle/quarantine.py, `_audit`): there the database's character set may refuse it and
the row is kept in ASCII with escapes; an all-ASCII row goes in as it is, two round trips a
message less. Both on a utf8mb3 legacy database, as many MariaDB/MySQL ones are, holding a
reverse job's books."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from nsb_endpoint import Endpoint

from bridge.commands.main import main as cli_main
from tests.review.test_issue45_review import reverse_nginn_job, utf8mb3


@pytest.mark.mariadb
def test_discard_audits_an_emoji_in_ascii_and_an_ascii_row_as_it_is(
        tmp_path: Path, pg_server: str, pg_schema: str, mariadb_database: str) -> None:
    utf8mb3(mariadb_database)
    config = reverse_nginn_job(tmp_path, pg_server, pg_schema, mariadb_database, ["Sender", "Other"])
    legacy = sa.create_engine(mariadb_database)
    nsb = sa.create_engine(pg_server)
    ep = Endpoint(nsb, pg_schema, "Orders")
    ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send",
                                             Tenant="acme \U0001f600"), b"{}")  # msg_headers (utf8mb3) refuses it
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0
    with legacy.connect() as conn:
        [mid] = conn.execute(sa.text("select message_id from qbridge_quarantine")).scalars().all()

    # The kept raw row holds the emoji: the audit row's first insert is refused, its ASCII kept.
    assert cli_main(["quarantine", "discard", "--id", mid, "--why", "tenant retired \u2014 ok", "-c", str(config)]) == 0
    with legacy.connect() as conn:
        rows = conn.execute(sa.text("select message_id, action, why, raw from qbridge_quarantine_audit")).all()
        left = conn.execute(sa.text("select count(*) from qbridge_quarantine")).scalar_one()
    assert left == 0
    [(audited, action, why, raw)] = rows
    assert (audited, action) == (mid, "discarded")
    assert why == "tenant retired \\u2014 ok", why  # the fallback's escapes: not lost, not mangled
    assert "\\ud83d\\ude00" in raw and raw.isascii(), raw

    # An all-ASCII message's audit row needs no savepoint and is kept exactly.
    ep.send(ep.address("Other"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), b"{}")  # no route
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0
    with legacy.connect() as conn:
        kept = conn.execute(sa.text("select message_id from qbridge_quarantine")).scalars().all()
    nsb.dispose()
    assert len(kept) == 1, kept
    assert cli_main(["quarantine", "discard", "--id", kept[0], "--why", "plain why", "-c", str(config)]) == 0
    with legacy.connect() as conn:
        why2 = conn.execute(sa.text("select why from qbridge_quarantine_audit where message_id = :m"), {"m": kept[0]}).scalar_one()
    legacy.dispose()
    assert why2 == "plain why"


@pytest.mark.mariadb
def test_a_discard_or_a_failed_replay_with_text_the_books_refuse_still_settles(
        tmp_path: Path, pg_server: str, pg_schema: str, mariadb_database: str) -> None:
    """The reasons a discard and a replay that fails again write into the ledger entry and the
    quarantine row take the audit row's fallback too: before, on utf8mb3 books an operator's
    `--why` with an emoji (1366 on qbridge_ledger.reason) or a new reason naming a type with one
    failed the command, and the message could not be settled (review of helper-42)."""
    utf8mb3(mariadb_database)
    config = reverse_nginn_job(tmp_path, pg_server, pg_schema, mariadb_database, ["Other"])
    legacy = sa.create_engine(mariadb_database)
    nsb = sa.create_engine(pg_server)
    ep = Endpoint(nsb, pg_schema, "Orders")
    for kind in ("Orders.Messages.Paczka\U0001f4e6, Orders.Messages", "Orders.Messages.OrderAccepted, Orders.Messages"):
        ep.send(ep.address("Other"), ep.headers(kind, "Send"), b"{}")  # no route for the queue
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0
    nsb.dispose()

    def kept() -> list[str]:
        with legacy.connect() as conn:
            return list(conn.execute(sa.text("select message_id from qbridge_quarantine")).scalars())

    with legacy.connect() as conn:
        by_type = {("emoji" if "U0001f4e6" in reason else "plain"): mid for mid, reason in
                   conn.execute(sa.text("select message_id, reason from qbridge_quarantine"))}
    assert set(by_type) == {"emoji", "plain"}, by_type  # the first reason kept escaped (issue 45)

    # Replayed, still no route: its new reason names the type, which utf8mb3 stores only escaped.
    mid = by_type["emoji"]
    assert cli_main(["quarantine", "replay", "--id", mid, "-c", str(config)]) == 1  # it failed again, and says so
    with legacy.connect() as conn:
        reason = conn.execute(sa.text("select reason from qbridge_quarantine where message_id = :m"),
                              {"m": mid}).scalar_one()
        action = conn.execute(sa.text("select action from qbridge_quarantine_audit where message_id = :m"),
                              {"m": mid}).scalar_one()
    assert "Paczka\\U0001f4e6" in reason and action == "replay-failed", reason

    # Discarded with an emoji in why: settled, the ledger's reason and the audit row escaped.
    assert cli_main(["quarantine", "discard", "--id", by_type["plain"], "--why", "gone \U0001f600", "--by", "bob",
                     "-c", str(config)]) == 0
    assert kept() == [mid]
    with legacy.connect() as conn:
        outcome, why = conn.execute(sa.text("select outcome, reason from qbridge_ledger where message_id = :m"),
                                    {"m": by_type["plain"]}).one()
    legacy.dispose()
    assert outcome == "skipped" and why == "discarded by bob: gone \\U0001f600", why
