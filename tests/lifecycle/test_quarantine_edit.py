"""Edit and replay (issue 28, ServicePulse's edit & retry): `quarantine show --raw` gives the kept
row, `quarantine replay --with FILE` delivers an edited copy once, under the same message id;
the key and identity columns cannot change; the audit trail keeps the row before and after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.demo.samples import nginn_row
from helpers import Bridge


@pytest.fixture()
def bridge(on_each_db):
    return on_each_db()


def _quarantined_id(b: Bridge, capsys) -> str:
    capsys.readouterr()
    assert b.cli("quarantine", "list", "--json") == 0
    [row] = json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]
    return row["message_id"]


def test_an_edited_row_is_delivered_once_however_often_it_is_replayed(bridge: Bridge, capsys, tmp_path: Path) -> None:
    b = bridge
    now = b.now_local()
    b.insert([nginn_row("MQueue1", 1, now), nginn_row("MQueue1", 2, now, headers="Filter=a=b")])
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 1
    mid = _quarantined_id(b, capsys)
    assert b.cli("quarantine", "show", "--id", mid, "--raw") == 0
    raw = json.loads(capsys.readouterr().out)
    assert raw["msg_headers"] == "Filter=a=b"
    # Without an edit the row still fails, as NGinn's own parser would.
    assert b.cli("quarantine", "replay", "--id", mid) == 1
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**raw, "msg_headers": "Filter=a"}))
    capsys.readouterr()
    assert b.cli("quarantine", "replay", "--id", mid, "--with", str(edited), "--by", "ops", "--why", "typo in Filter") == 0
    assert "replayed" in capsys.readouterr().out
    assert b.count("Orders") == 2
    delivered = [r for r in b.rows("Orders") if r["headers"]["NServiceBus.MessageId"] == mid]
    assert len(delivered) == 1 and delivered[0]["headers"]["Filter"] == "a"
    # The same edit replayed again: nothing is quarantined under that id any more.
    assert b.cli("quarantine", "replay", "--id", mid, "--with", str(edited)) == 1
    assert "not in quarantine" in capsys.readouterr().err
    assert b.count("Orders") == 2
    assert b.cli("sync", "--once") == 0 and b.count("Orders") == 2
    assert b.cli("verify") == 0
    capsys.readouterr()
    assert b.cli("quarantine", "history", "--json") == 0
    replayed = [h for h in json.loads(capsys.readouterr().out)["jobs"][0]["history"] if h["action"] == "replayed"]
    assert len(replayed) == 1
    assert replayed[0]["actor"] == "ops" and replayed[0]["why"] == "typo in Filter"
    assert "edited msg_headers" in replayed[0]["detail"] and '"msg_headers":"Filter=a"' in replayed[0]["detail"]


@pytest.mark.parametrize("column", ["id", "unique_id"])
def test_an_edit_of_the_key_or_an_identity_column_is_refused(bridge: Bridge, capsys, tmp_path: Path, column: str) -> None:
    b = bridge
    b.insert([nginn_row("MQueue1", 1, b.now_local(), headers="Filter=a=b")])
    assert b.cli("sync", "--once") == 0
    mid = _quarantined_id(b, capsys)
    assert b.cli("quarantine", "show", "--id", mid, "--raw") == 0
    raw = json.loads(capsys.readouterr().out)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**raw, "msg_headers": "Filter=a", column: 999 if column == "id" else "other"}))
    assert b.cli("quarantine", "replay", "--id", mid, "--with", str(edited), "--json") == 1
    [result] = json.loads(capsys.readouterr().out)["results"]
    assert result["action"] == "replay-failed" and column in result["detail"] and "nothing done" in result["detail"]
    assert b.count("Orders") == 0 and b.ledger() == {"quarantined": 1}


def test_a_bad_edit_file_gets_a_clear_error(bridge: Bridge, capsys, tmp_path: Path) -> None:
    b = bridge
    b.insert([nginn_row("MQueue1", 1, b.now_local(), headers="Filter=a=b")])
    assert b.cli("sync", "--once") == 0
    mid = _quarantined_id(b, capsys)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert b.cli("quarantine", "replay", "--id", mid, "--with", str(bad)) == 2
    assert "not JSON" in capsys.readouterr().err
    assert b.cli("quarantine", "replay", "--all", "--with", str(bad)) == 2
    assert "exactly one --id" in capsys.readouterr().err
    assert b.cli("quarantine", "list", "--raw") == 2
    assert b.ledger() == {"quarantined": 1}
