"""Failures in groups (issue 38): each quarantined message gets its reason's group, `quarantine
groups` lists them, and replay and discard take a group (and a queue, a type, a time) in
bounded pages with progress, stopped by Ctrl-C and resumed by running them again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from bridge.ledger.failure_groups import group_of, masked
from helpers import MAPPING, Bridge

NO_CATCH_ALL = MAPPING.replace('"*"       = "Unrouted"\n', "")


def test_reasons_that_differ_only_in_ids_numbers_values_and_times_share_a_group() -> None:
    a = group_of("j", "Q", "body is not JSON: Expecting value: line 1 column 5 (char 4)")
    assert a == group_of("j", "Q", "body is not JSON: Expecting value: line 3 column 17 (char 230)")
    assert a != group_of("j", "Q2", "body is not JSON: Expecting value: line 1 column 5 (char 4)"), "per queue"
    assert a != group_of("j2", "Q", "body is not JSON: Expecting value: line 1 column 5 (char 4)"), "per job"
    assert masked("handle ID:x-1#100 refers to message 'ID:x-1' at 2026-11-25 08:00:01 UTC, id "
                  "0b6c3f5e-8a1d-4c2b-9f3e-2d4a5b6c7d8e") == "handle <id>#<n> refers to message '…' at <time>, id <uuid>"
    assert masked("") == ""


def qb(b: Bridge, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", *args, "-c", str(b.config)], cwd=b.tmp, capture_output=True,
                          text=True, timeout=600)


def seed(b: Bridge, queue: str, n: int, body: str | None = None) -> None:
    rows = b.ready(n, queue=queue)
    for r in rows:
        r.pop("id", None)
        if body is not None:
            r["msg_text"] = body
    with b.source.begin() as conn:
        conn.execute(b.tables[queue].insert(), rows)


@pytest.mark.slow
def test_ten_thousand_in_two_groups_replayed_by_group_stopped_and_resumed(make) -> None:
    b = make(queues=["MQueue1", "MQueue3"], mapping=NO_CATCH_ALL, batch_size=2000)
    seed(b, "MQueue3", 6000)  # no route for MQueue3: one group
    seed(b, "MQueue1", 4000, body="{not json")  # a body that is not JSON: the other
    assert b.cli("sync", "--once") == 0
    assert b.ledger()["quarantined"] == 10_000

    r = qb(b, "quarantine", "groups", "--json")
    assert r.returncode == 0, r.stderr
    groups = {g["queue"]: g for g in json.loads(r.stdout)["jobs"][0]["groups"]}
    assert {q: g["count"] for q, g in groups.items()} == {"MQueue3": 6000, "MQueue1": 4000}
    assert "no route for queue" in groups["MQueue3"]["sample_reason"]
    assert groups["MQueue3"]["first_seen"] <= groups["MQueue3"]["last_seen"]
    listed = qb(b, "quarantine", "list", "--json", "--group", groups["MQueue1"]["group"])
    assert len(json.loads(listed.stdout)["jobs"][0]["quarantined"]) == 4000
    assert "MQueue1" in qb(b, "quarantine", "groups").stdout

    # The mapping is fixed for MQueue3; its group is replayed, stopped part-way by Ctrl-C ...
    (b.tmp / "mapping.toml").write_text(MAPPING)
    assert qb(b, "init").returncode == 0  # its catch-all queue
    group = groups["MQueue3"]["group"]
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "quarantine", "replay", "--group", group, "-c", str(b.config)],
                            cwd=b.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while b.count("Unrouted") < 300:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the replay did not start"
        time.sleep(0.2)
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped after" in err and "run the same command again" in err
    stopped_at = b.ledger()
    assert 300 <= stopped_at["delivered"] < 6000
    # ... and resumed: the rest, once each
    r = qb(b, "quarantine", "replay", "--group", group, "--by", "carol")
    assert r.returncode == 0, r.stderr
    assert f"{6000 - stopped_at['delivered']:,} messages" in r.stdout  # summed up, not 6,000 lines
    took = time.monotonic() - began
    ledger = b.ledger()
    assert ledger["delivered"] == 6000 and ledger["quarantined"] == 4000
    ids = b.message_ids("Unrouted")
    assert len(ids) == 6000 and set(ids.values()) == {1}
    groups_after = json.loads(qb(b, "quarantine", "groups", "--json").stdout)["jobs"][0]["groups"]
    assert [(g["queue"], g["count"]) for g in groups_after] == [("MQueue1", 4000)]
    # discard by queue and type: nothing matches the type, so nothing is discarded, and it says so (exit 1)
    r = qb(b, "quarantine", "discard", "--queue", "MQueue1", "--type", "NoSuchType", "--why", "x")
    assert r.returncode == 1 and "nothing in quarantine matches --queue MQueue1 --type NoSuchType" in " ".join(r.stderr.split())
    assert b.ledger()["quarantined"] == 4000
    assert b.cli("verify") == 0
    print(f"replayed a 6,000-row group in {took:.1f}s after the stop")


def test_init_groups_what_an_earlier_qbridge_quarantined(make) -> None:
    b = make(queues=["MQueue3"], mapping=NO_CATCH_ALL)
    seed(b, "MQueue3", 30)
    assert b.cli("sync", "--once") == 0
    q = f'"{b.target_schema}".qbridge_quarantine'
    with b.target.begin() as conn:  # as an earlier qbridge left it
        conn.execute(sa.text(f"drop index \"{b.target_schema}\".ix_qbridge_quarantine_group"))
        conn.execute(sa.text(f"alter table {q} drop column grp"))
    r = qb(b, "sync", "--once")
    assert r.returncode != 0 and "qbridge init" in r.stderr, r.stderr
    r = qb(b, "init")
    assert r.returncode == 0 and "grouped 30 quarantined messages" in r.stdout, r.stdout + r.stderr
    with b.target.connect() as conn:
        groups = conn.execute(sa.text(f"select grp, count(*) from {q} group by grp")).all()
        reason = conn.execute(sa.text(f"select reason from {q} limit 1")).scalar_one()
        indexes = {i["name"] for i in sa.inspect(conn).get_indexes("qbridge_quarantine", schema=b.target_schema)}
    assert len(groups) == 1 and groups[0][1] == 30 and groups[0][0] == group_of("job1", "MQueue3", reason)
    assert "ix_qbridge_quarantine_group" in indexes
    assert b.cli("sync", "--once") == 0


def test_discard_by_group_and_since_with_progress_lines_where_no_terminal_shows_a_bar(tmp_path, monkeypatch,
                                                                                      capsys) -> None:
    """`--since` picks the newer part of a group, `discard --group` gives it up, and without a
    terminal (a log, the journal) the progress comes as lines, not a line a message."""
    from datetime import UTC, datetime

    import bridge.commands.quarantine as quarantine_command
    from bridge.commands.main import main as cli_main

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", queues=["MQueue3"],
               mapping=NO_CATCH_ALL, batch_size=100)
    assert b.cli("init") == 0
    seed(b, "MQueue3", 60)
    assert b.cli("sync", "--once") == 0
    time.sleep(1.1)
    cut = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    time.sleep(1.1)
    seed(b, "MQueue3", 40)
    assert b.cli("sync", "--once") == 0
    capsys.readouterr()
    assert cli_main(["quarantine", "groups", "--json", "-c", str(b.config)]) == 0
    [group] = json.loads(capsys.readouterr().out)["jobs"][0]["groups"]
    assert group["count"] == 100
    assert cli_main(["quarantine", "list", "--json", "--since", cut, "-c", str(b.config)]) == 0
    assert len(json.loads(capsys.readouterr().out)["jobs"][0]["quarantined"]) == 40

    monkeypatch.setattr(quarantine_command, "PROGRESS_EVERY", 0.0)
    assert cli_main(["quarantine", "discard", "--group", group["group"], "--since", cut, "--why", "stale test orders",
                     "--by", "frank", "-c", str(b.config)]) == 0
    said = capsys.readouterr()
    assert said.out.count("discarded by frank: stale test orders") == 40, said.out  # each shown: 40 <= 50
    lines = [ln for ln in said.err.splitlines() if ln.startswith("qbridge: discard job1:")]
    assert lines[-1] == "qbridge: discard job1: 40 of 40 messages", said.err
    assert b.ledger()["quarantined"] == 60
    assert cli_main(["quarantine", "groups", "--json", "-c", str(b.config)]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["groups"][0]["count"] == 60
    assert cli_main(["quarantine", "discard", "--group", group["group"], "--why", "the rest", "-c", str(b.config)]) == 0
    said = capsys.readouterr()
    assert "60 messages" in said.out, said.out  # summed up beyond 50
    assert b.ledger()["quarantined"] == 0
    b.dispose()
