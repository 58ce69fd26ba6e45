"""Review of 14bda14 (a discard's why and a failed replay's new reason kept in ASCII where the
books' character set refuses them). docs/quarantine.md now promises that on "a utf8mb3 or
Latin-1 legacy database" the replay or discard "is done, not refused". On a Latin-1
PostgreSQL legacy database (a supported legacy URL: docs/configuration.md) psycopg encodes the
parameters in the connection's client encoding (LATIN1, nothing sets UTF8) and raises a
UnicodeEncodeError before the server sees the statement: write_in_any_charset catches only
sqlalchemy's DataError, so the fallback never runs and the discard fails as it did before.

FAILS at 14bda14."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from nsb_endpoint import Endpoint

from bridge.commands.main import main as cli_main
from tests.review.test_adbc_read_ahead_review import latin1_db  # noqa: F401 - a pytest fixture
from tests.review.test_issue45_review import reverse_nginn_job


def test_discard_with_an_emoji_why_settles_on_a_latin1_postgresql_legacy_database(
        tmp_path: Path, pg_server: str, pg_schema: str, latin1_db: str) -> None:
    config = reverse_nginn_job(tmp_path, pg_server, pg_schema, latin1_db, ["Other"])
    legacy = sa.create_engine(latin1_db)
    nsb = sa.create_engine(pg_server)
    ep = Endpoint(nsb, pg_schema, "Orders")
    ep.send(ep.address("Other"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), b"{}")  # no route
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0
    nsb.dispose()
    with legacy.connect() as conn:
        [mid] = conn.execute(sa.text("select message_id from qbridge_quarantine")).scalars().all()

    try:
        rc = cli_main(["quarantine", "discard", "--id", mid, "--why", "gone \U0001f600", "--by", "bob", "-c", str(config)])
    except UnicodeEncodeError as e:  # what 14bda14 does: the fallback is never reached
        pytest.fail(f"the discard was refused: {e!r}")
    assert rc == 0
    with legacy.connect() as conn:
        left = conn.execute(sa.text("select count(*) from qbridge_quarantine")).scalar_one()
        outcome, why = conn.execute(sa.text("select outcome, reason from qbridge_ledger where message_id = :m"),
                                    {"m": mid}).one()
    legacy.dispose()
    assert left == 0 and outcome == "skipped" and why == "discarded by bob: gone \\U0001f600", (left, outcome, why)


def test_a_pass_quarantines_a_message_whose_reason_latin1_cannot_hold_on_a_postgresql_legacy_database(
        tmp_path: Path, pg_server: str, pg_schema: str, latin1_db: str) -> None:
    """The pass's own quarantine rows (a COPY on PostgreSQL) take the same fallback: a reason
    naming a type with an emoji is kept escaped, not the pass failed on a UnicodeEncodeError."""
    config = reverse_nginn_job(tmp_path, pg_server, pg_schema, latin1_db, ["Other"])
    legacy = sa.create_engine(latin1_db)
    nsb = sa.create_engine(pg_server)
    ep = Endpoint(nsb, pg_schema, "Orders")
    ep.send(ep.address("Other"), ep.headers("Orders.Messages.Paczka\U0001f4e6, Orders.Messages", "Send"), b"{}")
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0
    nsb.dispose()
    with legacy.connect() as conn:
        [reason] = conn.execute(sa.text("select reason from qbridge_quarantine")).scalars().all()
    legacy.dispose()
    assert "Paczka\\U0001f4e6" in reason, reason
