"""`qbridge quarantine list|show`: an operator finds what was quarantined, why, and the whole row."""

from __future__ import annotations

import json

import pytest


@pytest.mark.postgres
def test_list_and_show_quarantined_rows(make, capsys: pytest.CaptureFixture[str]) -> None:
    b = make()
    rows = b.ready(5)
    rows[1]["msg_text"] = "{not json"
    rows[3]["msg_headers"] = "Filter=a=b"
    b.insert(rows)
    assert b.cli("sync", "--once") == 0
    capsys.readouterr()

    assert b.cli("quarantine", "list", "--json") == 0
    [job] = json.loads(capsys.readouterr().out)["jobs"]
    listed = job["quarantined"]
    assert [r["queue"] for r in listed] == ["MQueue1", "MQueue1"] and all("raw" not in r for r in listed)
    reasons = " | ".join(r["reason"] for r in listed)
    assert "not valid JSON" in reasons and "more than one '='" in reasons

    wanted = listed[0]["message_id"]
    assert b.cli("quarantine", "show", "--id", wanted, "--json") == 0
    [shown] = json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]
    assert shown["message_id"] == wanted and shown["raw"]["subqueue"] == "I" and "msg_text" in shown["raw"]

    assert b.cli("quarantine", "list") == 0
    assert wanted in capsys.readouterr().out
    assert b.cli("quarantine", "show") == 2  # which ones: --id or --all
    capsys.readouterr()
    assert b.cli("quarantine", "show", "--id", "no-such-id") == 1
    assert "not in quarantine: no-such-id" in capsys.readouterr().err
