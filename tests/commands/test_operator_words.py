"""What the commands say is what an operator can act on (issue 46, findings 9 and 10): a
quarantined message is named by the id or the source key `quarantine list` shows; a filter that
matches nothing is an error, not an empty table that exits 0; `[routes]` in a reason is printed,
not eaten as markup; nothing an operator needs is cut short; `qbridge --version`; `discover
--write` says that the time zone it wrote is a guess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.commands.main import main as cli
from bridge.demo.samples import create_nginn_queue, nginn_row
from helpers import MAPPING, Bridge

UNROUTED = MAPPING.replace('"*"       = "Unrouted"\n', "")  # MQueue3 has no route: its messages are quarantined


@pytest.fixture()
def quarantined(tmp_path: Path) -> Bridge:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", queues=["MQueue1", "MQueue3"],
               mapping=UNROUTED)
    assert b.cli("init") == 0
    b.insert(b.ready(3, queue="MQueue3"), queue="MQueue3")
    b.insert(b.ready(3))
    assert b.cli("sync", "--once") == 0
    return b


def test_a_quarantined_message_is_named_by_the_source_key_list_shows(quarantined: Bridge, capsys) -> None:
    b = quarantined
    capsys.readouterr()
    assert b.cli("quarantine", "list", "--json") == 0
    rows = json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]
    key = rows[0]["source_key"]
    assert b.cli("quarantine", "show", "--id", key, "--json") == 0
    [shown] = json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]
    assert shown["message_id"] == rows[0]["message_id"]
    assert b.cli("quarantine", "discard", "--id", key, "--why", "by its key") == 0
    assert b.ledger()["quarantined"] == 2
    assert b.cli("quarantine", "show", "--id", "no-such-id") == 1
    assert "not in quarantine: no-such-id" in capsys.readouterr().err


def test_a_source_key_two_queues_share_must_be_given_as_the_message_id(tmp_path: Path, capsys) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", queues=["MQueue3", "MQueue4"],
               mapping='[routes]\n"MQueue1" = "Orders"\n')
    assert b.cli("init") == 0
    for q in ("MQueue3", "MQueue4"):
        b.insert(b.ready(1, queue=q), queue=q)
    assert b.cli("sync", "--once") == 0
    capsys.readouterr()
    assert b.cli("quarantine", "replay", "--id", "1") == 2
    said = capsys.readouterr().err
    assert "source key '1' names 2 quarantined messages" in said and "give the message id" in said
    assert b.ledger()["quarantined"] == 2


def test_a_filter_that_matches_nothing_is_an_error(quarantined: Bridge, capsys) -> None:
    capsys.readouterr()
    assert quarantined.cli("quarantine", "replay", "--group", "nosuch") == 1
    said = capsys.readouterr()
    assert "nothing in quarantine matches --group nosuch" in said.err and "quarantine groups" in said.err
    assert said.out == ""
    assert quarantined.ledger()["quarantined"] == 3


def test_a_reason_naming_a_mapping_section_is_printed_whole(quarantined: Bridge) -> None:
    r = subprocess.run([sys.executable, "-m", "bridge", "quarantine", "list", "-c", str(quarantined.config)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "[routes]" in text.replace("│ ", "").replace(" │", ""), r.stdout


def test_status_history_cuts_nothing_short(quarantined: Bridge, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal 80 columns wide (Rich cut cells with an ellipsis there)."""
    import io

    from rich.console import Console

    from bridge.commands import books

    b = quarantined
    why = "the Orders endpoint is redeployed by the platform team during the 02:00 window, ticket OPS-123456789"
    assert b.cli("pause", "--job", "job1", "--why", why) == 0
    screen = io.StringIO()
    monkeypatch.setattr(books, "out", Console(file=screen, width=80, markup=False))
    assert b.cli("status", "--history") == 0
    text = screen.getvalue()
    assert "…" not in text, text
    assert "OPS-123456789" in "".join(text.replace("│", " ").split()), text


def test_version() -> None:
    r = subprocess.run([sys.executable, "-m", "bridge", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("qbridge ") and r.stdout.split()[1][0].isdigit(), r


def test_discover_write_says_the_time_zone_is_a_guess(tmp_path: Path, capsys) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/legacy.db")
    t = create_nginn_queue(engine, "Inbox")
    with engine.begin() as conn:
        conn.execute(t.insert().values(nginn_row("Inbox", 1, __import__("datetime").datetime(2026, 1, 1))))
    engine.dispose()
    assert cli(["discover", f"sqlite:///{tmp_path}/legacy.db", "--write", str(tmp_path / "w")]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "check timezone in the config: nginn write local times" in said and 'guesses "UTC"' in said
