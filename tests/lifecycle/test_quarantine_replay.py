"""`qbridge quarantine replay|discard|history`: an operator fixes the mapping and replays what
was quarantined (delivered once, even when replayed twice or beside a running job), gives up
what cannot be fixed with a reason, and `verify` keeps balancing throughout."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from helpers import MAPPING, kill_at
from tests.systems.test_reverse_nginn import TwoWay  # noqa: F401 - the two_way fixture's class
from tests.systems.test_reverse_nginn import two_way  # noqa: F401 - a pytest fixture
from nsb_endpoint import Endpoint

NO_CATCH_ALL = MAPPING.replace('"*"       = "Unrouted"\n', "")


def _out(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.postgres
def test_replay_after_fixing_the_mapping_delivers_once_and_discard_keeps_an_audit_trail(
        make, capsys: pytest.CaptureFixture[str]) -> None:
    b = make(queues=["MQueue3"], mode="move", mapping=NO_CATCH_ALL)
    rows = b.ready(4, queue="MQueue3")
    rows[2]["msg_text"] = "{not json"
    ids = b.insert(rows, queue="MQueue3")
    assert b.cli("sync", "--once") == 0
    assert b.ledger() == {"quarantined": 4}
    assert set(b.subqueues("MQueue3").values()) == {"I"}  # move mode leaves quarantined rows where they are
    capsys.readouterr()
    assert b.cli("quarantine", "list", "--json") == 0
    listed = {r["source_key"]: r for r in _out(capsys)["jobs"][0]["quarantined"]}
    assert "no route for queue 'MQueue3'" in listed[str(ids[0])]["reason"]
    bad = listed[str(ids[2])]["message_id"]

    # Nothing to do without saying which.
    assert b.cli("quarantine", "replay") == 2
    assert b.cli("quarantine", "discard") == 2
    assert "needs --id ID... (see `qbridge quarantine list`) or --all" in capsys.readouterr().err

    b.mapping = NO_CATCH_ALL.replace('"MQueue1" = "Orders"', '"MQueue1" = "Orders"\n"MQueue3" = "Orders"')
    b.write_config()
    assert b.cli("quarantine", "replay", "--all", "--by", "alice", "--why", "route added", "--json") == 1  # one still fails
    results = {r["source_key"]: r for r in _out(capsys)["results"]}
    assert {k: (r["action"], r["outcome"]) for k, r in results.items()} == {
        str(ids[0]): ("replayed", "delivered"), str(ids[1]): ("replayed", "delivered"),
        str(ids[2]): ("replay-failed", "quarantined"), str(ids[3]): ("replayed", "delivered")}
    assert "not valid JSON" in results[str(ids[2])]["detail"]
    delivered = b.message_ids("Orders")
    assert len(delivered) == 3 and set(delivered.values()) == {1}
    assert {listed[str(i)]["message_id"] for i in (ids[0], ids[1], ids[3])} == set(delivered)
    assert b.subqueues("MQueue3") == {ids[0]: "X", ids[1]: "X", ids[2]: "I", ids[3]: "X"}  # consumed once delivered
    [orders_row] = [r for r in b.rows("Orders") if r["headers"]["NServiceBus.MessageId"] == listed[str(ids[0])]["message_id"]]
    assert orders_row["headers"]["NServiceBus.CorrelationId"] == "corr-1"

    # A second replay touches only what is still quarantined; nothing is delivered twice.
    assert b.cli("quarantine", "replay", "--all", "--json") == 1
    assert [r["source_key"] for r in _out(capsys)["results"]] == [str(ids[2])]
    assert b.cli("quarantine", "replay", "--id", listed[str(ids[0])]["message_id"]) == 1
    assert "not in quarantine" in capsys.readouterr().err
    assert b.count("Orders") == 3
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 3
    assert b.cli("verify") == 0
    capsys.readouterr()

    assert b.cli("quarantine", "discard", "--id", bad, "--by", "bob", "--why", "poison; sender fixed upstream", "--json") == 0
    [d] = _out(capsys)["results"]
    assert (d["action"], d["outcome"]) == ("discarded", "skipped") and "bob" in d["detail"]
    assert b.ledger() == {"delivered": 3, "skipped": 1}
    assert b.cli("quarantine", "list", "--json") == 0
    assert _out(capsys)["jobs"][0]["quarantined"] == []
    assert b.cli("verify", "--json") == 0
    capsys.readouterr()

    assert b.cli("quarantine", "history", "--json") == 0
    history = _out(capsys)["jobs"][0]["history"]
    assert [(h["source_key"], h["action"]) for h in history if h["source_key"] == str(ids[2])] == [
        (str(ids[2]), "replay-failed"), (str(ids[2]), "replay-failed"), (str(ids[2]), "discarded")]
    last = history[-1]
    assert (last["actor"], last["why"], last["outcome"]) == ("bob", "poison; sender fixed upstream", "skipped")
    assert "not valid JSON" in last["reason"]
    assert sum(h["action"] == "replayed" for h in history) == 3 and {h["actor"] for h in history if h["action"] == "replayed"} == {"alice"}
    with b.target.connect() as conn:  # the raw row went into the audit trail, not away
        raw = conn.execute(sa.text(f'select raw from "{b.target_schema}".qbridge_quarantine_audit where action = \'discarded\'')).scalar_one()
    assert orjson.loads(raw)["msg_text"] == "{not json"
    assert b.cli("quarantine", "history") == 0
    text = capsys.readouterr().out
    assert "discarded" in text and "bob" in text and "alice" in text


@pytest.mark.postgres
def test_replay_of_a_reverse_message_consumed_from_the_proxy_queue(two_way, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    tw = two_way()
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    unknown = ep.headers("Orders.Messages.OrderCancelled, Orders.Messages", "Send")
    ep.send(ep.address("Sender"), unknown, b'{"OrderId":7}')
    assert tw.cli("sync", "--once", "--job", "to-legacy") == 0
    assert tw.nsb_count("Sender") == 0 and tw.rows(tw.sender) == []  # taken off the proxy queue, kept in quarantine
    capsys.readouterr()
    assert tw.cli("quarantine", "replay", "--all", "--job", "to-legacy", "--json") == 1
    [r] = _out(capsys)["results"]
    assert r["action"] == "replay-failed" and "has no legacy name" in r["detail"]

    (tmp_path / "reverse.toml").write_text((tmp_path / "reverse.toml").read_text()
                                           + '"Orders.OrderCancelled, Orders" = "Orders.Messages.OrderCancelled, Orders.Messages"\n')
    assert tw.cli("quarantine", "replay", "--all", "--job", "to-legacy", "--json") == 0
    [r] = _out(capsys)["results"]
    assert (r["action"], r["outcome"]) == ("replayed", "delivered")
    [row] = tw.rows(tw.sender)
    assert row["unique_id"] == unknown["NServiceBus.MessageId"] and row["subqueue"] == "I"
    assert orjson.loads(row["msg_text"]) == {"$type": "Orders.OrderCancelled, Orders", "OrderId": 7}
    assert tw.cli("quarantine", "replay", "--all", "--job", "to-legacy") == 0  # nothing left: nothing done
    assert len(tw.rows(tw.sender)) == 1
    assert tw.cli("verify", "--job", "to-legacy") == 0


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["replay_before_commit", "replay_after_commit"])
def test_sigkill_during_replay_loses_and_doubles_nothing(make, point: str, tmp_path: Path) -> None:
    b = make(queues=["MQueue3"], mode="move", mapping=NO_CATCH_ALL)
    ids = b.insert(b.ready(2, queue="MQueue3"), queue="MQueue3")
    assert b.cli("sync", "--once") == 0
    b.mapping = NO_CATCH_ALL.replace('"MQueue1" = "Orders"', '"MQueue1" = "Orders"\n"MQueue3" = "Orders"')
    b.write_config()

    kill_at(b, point, tmp_path, ("quarantine", "replay", "--all"))  # killed inside the first message's replay
    if point == "replay_before_commit":
        assert b.count("Orders") == 0 and b.ledger() == {"quarantined": 2}
    else:  # delivered, the legacy row not yet consumed: the checkpoint holds its key for the next pass
        assert b.count("Orders") == 1 and b.ledger() == {"quarantined": 1, "delivered": 1}
        assert sorted(b.subqueues("MQueue3").values()) == ["I", "I"]
    assert b.cli("quarantine", "replay", "--all") == 0
    assert b.cli("sync", "--once") == 0
    delivered = b.message_ids("Orders")
    assert len(delivered) == 2 and set(delivered.values()) == {1}
    assert b.subqueues("MQueue3") == {ids[0]: "X", ids[1]: "X"}
    assert b.ledger() == {"delivered": 2}
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_two_operators_replaying_at_once_deliver_once(make) -> None:
    import threading

    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    from bridge.lifecycle.quarantine import QuarantineDesk

    b = make(queues=["MQueue3"], mapping=NO_CATCH_ALL)
    b.insert(b.ready(40, queue="MQueue3"), queue="MQueue3")
    assert b.cli("sync", "--once") == 0
    b.mapping = NO_CATCH_ALL.replace('"MQueue1" = "Orders"', '"MQueue1" = "Orders"\n"MQueue3" = "Orders"')
    b.write_config()
    config = load_config(b.config)
    results: dict[str, list] = {}
    go = threading.Barrier(2)

    def operator(name: str) -> None:
        desk = QuarantineDesk(JobRunner(config, config.jobs[0]), name, None)
        go.wait()
        results[name] = desk.replay(None)

    threads = [threading.Thread(target=operator, args=(n,)) for n in ("ann", "ben")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    replayed = [o.message_id for rs in results.values() for o in rs if o.action == "replayed"]
    assert len(replayed) == 40 and len(set(replayed)) == 40
    assert sum(o.action == "not-quarantined" for rs in results.values() for o in rs) == 40
    delivered = b.message_ids("Orders")
    assert len(delivered) == 40 and set(delivered.values()) == {1}
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_discard_without_why_still_says_so_in_the_audit_trail(make, capsys: pytest.CaptureFixture[str]) -> None:
    b = make()
    rows = b.ready(2)
    rows[0]["msg_text"] = "{not json"
    b.insert(rows)
    assert b.cli("sync", "--once") == 0
    capsys.readouterr()
    assert b.cli("quarantine", "discard", "--all", "--json") == 0  # the form GUIDE.md gives, for tools
    captured = capsys.readouterr()
    assert "discarding without --why" in captured.err
    [d] = json.loads(captured.out)["results"]
    assert d["action"] == "discarded" and "(no reason given)" in d["detail"]
    assert b.cli("quarantine", "history", "--json") == 0
    [h] = _out(capsys)["jobs"][0]["history"]
    assert h["why"] == "(no reason given)" and h["actor"]
    assert b.cli("verify") == 0


@pytest.mark.postgres
def test_replay_refuses_when_the_source_identity_changed(make, capsys: pytest.CaptureFixture[str]) -> None:
    b = make(queues=["MQueue3"], mapping=NO_CATCH_ALL)
    b.insert(b.ready(1, queue="MQueue3"), queue="MQueue3")
    assert b.cli("sync", "--once") == 0
    b.mapping = NO_CATCH_ALL.replace('"MQueue1" = "Orders"', '"MQueue1" = "Orders"\n"MQueue3" = "Orders"')
    b.write_config()
    b.config.write_text(b.config.read_text().replace('database = "LegacyDb"', 'database = "RenamedDb"'))
    capsys.readouterr()
    assert b.cli("quarantine", "replay", "--all", "--json") == 1
    [r] = _out(capsys)["results"]
    assert r["action"] == "replay-failed" and "differs from the ledger's" in r["detail"] and "RenamedDb" in r["detail"]
    assert b.count("Orders") == 0 and b.ledger() == {"quarantined": 1}


@pytest.mark.postgres
def test_discard_after_the_source_identity_changed_still_settles_the_ledger_entry(make, capsys: pytest.CaptureFixture[str]) -> None:
    """The ledger is keyed by the queue's origin, made from today's source identity; an entry made
    under the earlier one is found by its message id instead, and turned into a skip."""
    b = make(queues=["MQueue3"], mapping=NO_CATCH_ALL)
    b.insert(b.ready(1, queue="MQueue3"), queue="MQueue3")
    assert b.cli("sync", "--once") == 0
    b.config.write_text(b.config.read_text().replace('database = "LegacyDb"', 'database = "RenamedDb"'))
    capsys.readouterr()
    assert b.cli("quarantine", "discard", "--all", "--why", "gone", "--json") == 0
    [d] = _out(capsys)["results"]
    assert d["action"] == "discarded" and d["outcome"] == "skipped"
    assert b.ledger() == {"skipped": 1}
    assert b.cli("quarantine", "list", "--json") == 0
    assert _out(capsys)["jobs"][0]["quarantined"] == []


def test_a_replay_connects_before_it_maps_only_for_a_target_that_reads_per_batch() -> None:
    """The connection a replay opens for `begin_batch` before mapping each message (an OpenJMS
    store's destinations, a BizTalk staging table's check) is only opened where the target
    overrides it: for the NServiceBus and NGinn targets it was a checkout and a ping a message."""
    from bridge.targets.biztalk import BizTalkTarget
    from bridge.targets.nginn import NGinnTarget
    from bridge.targets.nservicebus import NServiceBusTarget
    from bridge.targets.openjms import OpenJMSTarget

    reads = {c.__name__: c.reads_per_batch.fget(object.__new__(c))  # type: ignore[attr-defined]
             for c in (NServiceBusTarget, NGinnTarget, OpenJMSTarget, BizTalkTarget)}
    assert reads == {"NServiceBusTarget": False, "NGinnTarget": False, "OpenJMSTarget": True, "BizTalkTarget": True}
