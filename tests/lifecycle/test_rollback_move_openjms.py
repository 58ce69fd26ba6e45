"""`qbridge rollback` of a move-mode OpenJMS job (issue 28): move mode deleted the handles (and the
messages no handle held), so each withdrawn message is rebuilt from the row the job delivered and
re-inserted, with its JMSMessageID, headers, typed properties and body kind, where OpenJMS's
consumer expects it; a SIGKILL between any two commits and a rerun lose and double nothing (a mark
in the legacy database says which give-backs committed); a subscriber gone meanwhile sends the
message to qbridge's quarantine, not into the void."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.codecs.openjms_blob import decode
from bridge.ledger.giveback_marks import MARKS
from helpers import endpoint_takes, kill_at
from tests.systems.test_openjms_source import BINARY_ID, QUEUE_ID, SUBSCRIBERS, TOPIC_ID, Jms, blob, make_jms

TABLES = ("Orders", "Binary", "Billing", "AuditTrail")
KINDS = ["map_msg.bin", "stream_msg.bin", "object_msg.bin", "bytes_msg.bin", "plain_msg.bin", "text_unicode.bin",
         "real0761_text_int_property.bin", "correlation_provider.bin", "replyto_temp_queue.bin"]


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def jms(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":  # the OpenJMS store and the NServiceBus tables each in a file, as the demo has them
        from tests.systems.test_openjms_source import MAPPING

        j = Jms(tmp_path, f"sqlite:///{tmp_path}/openjms.db", f"sqlite:///{tmp_path}/nsb.db", system="openjms",
                queues=["orders", "prices.eu", "binary.in"], mapping=MAPPING, mode="move", batch_size=4)
        j.seed()
        assert j.cli("init") == 0
        yield j
        j.dispose()
        return
    pg_server, pg_schema = request.getfixturevalue("pg_server"), request.getfixturevalue("pg_schema")
    yield from make_jms(request.param, request, tmp_path, pg_server, pg_schema, mode="move", batch_size=4)


def _fill(j: Jms) -> dict[str, bytes]:
    """Queue messages of every body kind, and a topic message with two durable subscribers;
    returns messageId -> blob as stored."""
    from bridge.demo.samples import openjms_message

    stored = {}
    j.queue_message("ID:q-1", "text_simple.bin", accepted=1_141_916_400_000, delivered=1)
    stored["ID:q-1"] = blob("text_simple.bin")
    for i, name in enumerate(KINDS):
        mid = f"ID:b-{i}"
        j.store(lambda c, t, mid=mid, name=name, i=i: openjms_message(c, t, mid, BINARY_ID, blob(name), [BINARY_ID * 100],
                                                                   accepted=1_141_916_400_100 + i))
        stored[mid] = blob(name)
    topic = blob("real0761_text_durable_topic_overflowed_expiration.bin")
    j.store(lambda c, t: openjms_message(c, t, "ID:t-1", TOPIC_ID, topic, list(SUBSCRIBERS.values()), delivered=1))
    stored["ID:t-1"] = topic
    return stored


def _handles(j: Jms) -> set[tuple[str, int]]:
    with j.source.connect() as conn:
        h = j.jms_tables["message_handles"]
        return {(m, int(c)) for m, c in conn.execute(sa.select(h.c.messageid, h.c.consumerid))}


def _blobs(j: Jms) -> dict[str, bytes]:
    with j.source.connect() as conn:
        m = j.jms_tables["messages"]
        return {mid: bytes(b) for mid, b in conn.execute(sa.select(m.c.messageid, m.c.messageblob))}


def _same_message(before: bytes, after: bytes, kind: str) -> None:
    """What a JMS consumer reads of the message is what it read before move mode took it
    (`kind`: of the destination the store holds it in)."""
    a, b = decode(before), decode(after)
    assert (b.java_class, b.message_type, b.body, b.properties) == (a.java_class, a.message_type, a.body, a.properties)
    for name in ("JMSMessageID", "JMSCorrelationID", "JMSType", "JMSDeliveryMode", "JMSPriority", "JMSTimestamp",
                 "JMSRedelivered"):
        assert b.headers[name] == a.headers[name], name
    assert b.headers["JMSDestination"]["name"] == a.headers["JMSDestination"]["name"]
    assert b.headers["JMSDestination"]["kind"] == kind
    reply_a, reply_b = a.headers["JMSReplyTo"], b.headers["JMSReplyTo"]
    assert (reply_a or {}).get("name") == (reply_b or {}).get("name")
    assert (reply_a or {}).get("temporary") == (reply_b or {}).get("temporary")
    expiry = a.headers["JMSExpiration"]
    assert b.headers["JMSExpiration"] == (expiry if expiry > 0 else 0)


def test_handles_come_back_as_they_were_and_are_delivered_again_once(jms: Jms, capsys) -> None:
    j = jms
    stored = _fill(j)
    handles = _handles(j)
    assert len(handles) == 1 + len(KINDS) + 2
    assert j.cli("sync", "--once") == 0
    before = j.message_ids(*TABLES)
    assert sum(before.values()) == len(handles) and not _handles(j) and not _blobs(j)  # move mode took them all
    taken = endpoint_takes(j, 2, table="Binary")
    capsys.readouterr()
    assert j.cli("rollback", "--job", "job1", "--dry-run", "--json") == 0
    plan = {q["queue"]: q for q in json.loads(capsys.readouterr().out)["queues"]}
    assert sum(q["given_back"] for q in plan.values()) == len(handles) - 2
    assert not _handles(j)
    assert j.cli("rollback", "--yes", "--job", "job1", "--json") == 0
    done = {q["queue"]: q for q in json.loads(capsys.readouterr().out)["queues"]}
    assert sum(q["withdrawn"] for q in done.values()) == sum(q["given_back"] for q in done.values()) == len(handles) - 2
    assert sum(q["consumed"] for q in done.values()) == 2
    assert not j.message_ids(*TABLES) - Counter(taken)
    back = _handles(j)
    assert len(back) == len(handles) - 2 and back <= handles  # the same messageId and consumer per handle
    blobs = _blobs(j)
    for mid, new in blobs.items():
        _same_message(stored[mid], new, "topic" if mid == "ID:t-1" else "queue")
    with j.source.connect() as conn:
        prefix = f'"{j.source_schema}".' if j.source_schema else ""
        assert conn.execute(sa.text(f"select count(*) from {prefix}{MARKS}")).scalar_one() == 0  # nothing owed: no mark kept
    assert j.cli("verify") == 0
    assert j.cli("sync", "--once") == 0
    again = j.message_ids(*TABLES)
    assert again == Counter({m: 1 for m in before if m not in taken}) and not _handles(j)
    assert j.cli("verify") == 0


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["rollback_before_commit:2", "rollback_after_commit:2",
                                   "giveback_before_legacy_commit:2", "giveback_after_legacy_commit:2"])
def test_killed_between_any_two_commits_nothing_is_lost_or_doubled(request, tmp_path: Path, pg_server: str,
                                                                   pg_schema: str, point: str) -> None:
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, mode="move", batch_size=4):
        _fill(j)
        handles = _handles(j)
        assert j.cli("sync", "--once") == 0
        before = j.message_ids(*TABLES)
        # The killed run's batches are of 1,000 messages: a third of the queues is enough to reach :2.
        kill_at(j, point, tmp_path, ["rollback", "--yes", "--job", "job1"])
        # A rerun (or a pass, which gives back what is owed before it reads) finishes the give-back.
        assert j.cli("rollback", "--yes", "--job", "job1") == 0
        assert _handles(j) == handles
        assert j.cli("verify") == 0
        assert j.cli("sync", "--once") == 0
        assert j.message_ids(*TABLES) == Counter({m: 1 for m in before}) and not _handles(j)
        assert j.cli("verify") == 0


@pytest.mark.postgres
def test_a_handle_taken_again_after_a_cut_off_give_back_is_not_given_back_twice(request, tmp_path: Path, pg_server: str,
                                                                                pg_schema: str) -> None:
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, mode="move", batch_size=4):
        _fill(j)
        assert j.cli("sync", "--once") == 0
        kill_at(j, "giveback_after_legacy_commit:1", tmp_path, ["rollback", "--yes", "--job", "job1"])
        first = _handles(j)
        assert first  # committed on the legacy side, still owed on qbridge's
        # OpenJMS's own consumer takes them (deletes the handles and messages) before anything reruns.
        with j.source.begin() as conn:
            conn.execute(sa.delete(j.jms_tables["message_handles"]))
            conn.execute(sa.delete(j.jms_tables["messages"]))
        assert j.cli("rollback", "--yes", "--job", "job1") == 0
        assert not (_handles(j) & first)  # the marks said they had been given back
        with j.source.connect() as conn:
            assert conn.execute(sa.text(f"select count(*) from {MARKS}")).scalar_one() == 0


@pytest.mark.postgres
def test_a_subscriber_gone_before_the_give_back_sends_its_message_to_quarantine(request, tmp_path: Path, pg_server: str,
                                                                               pg_schema: str, capsys) -> None:
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, mode="move", batch_size=4):
        _fill(j)
        assert j.cli("sync", "--once") == 0
        billing = j.message_ids("Billing")
        kill_at(j, "rollback_after_commit:1", tmp_path, ["rollback", "--yes", "--job", "job1", "--queue", "prices.eu"])
        with j.source.begin() as conn:  # the durable subscriber unsubscribes meanwhile
            c = j.jms_tables["consumers"]
            conn.execute(sa.delete(c).where(c.c.consumerid == SUBSCRIBERS["billing-sub"]))
        capsys.readouterr()
        assert j.cli("rollback", "--yes", "--job", "job1", "--queue", "prices.eu", "--json") == 0
        [w] = json.loads(capsys.readouterr().out)["queues"]
        assert w["quarantined"] == 1 and w["given_back"] >= 1
        assert _handles(j) == {("ID:t-1", SUBSCRIBERS["audit-sub"])}
        assert j.cli("quarantine", "replay", "--job", "job1", "--all") == 0
        assert j.message_ids("Billing") == billing  # delivered again, once
        assert j.cli("verify") == 0


def test_without_the_marks_table_rollback_names_init(jms: Jms, capsys) -> None:
    jms.queue_message("ID:m-1")
    assert jms.cli("sync", "--once") == 0
    with jms.source.begin() as conn:
        conn.execute(sa.text(f"drop table {MARKS}"))
    capsys.readouterr()
    assert jms.cli("rollback", "--yes", "--job", "job1") != 0
    err = capsys.readouterr().err
    assert MARKS in err and "qbridge init" in err
    assert jms.count("Orders") == 1
    assert jms.cli("init") == 0
    assert jms.cli("rollback", "--yes", "--job", "job1") == 0
    assert jms.count("Orders") == 0 and _handles(jms) == {("ID:m-1", QUEUE_ID * 100)}


@pytest.mark.parametrize("system", ["openjms", "biztalk"])
def test_init_and_rollback_print_the_marks_table_for_a_dba(tmp_path: Path, capsys, system: str) -> None:
    (tmp_path / "m.toml").write_text('[routes]\n"orders" = "Orders"\n')
    (tmp_path / "c.toml").write_text(
        '[connections]\nlegacy = "mssql+pyodbc://u:p@legacy-dsn"\nnsb = "mssql+pyodbc://u:p@nsb-dsn"\n'
        f'[[jobs]]\nname = "j"\nmode = "move"\nsource = {{ system = "{system}", connection = "legacy", '
        'queues = ["orders"], schema = "jms" }\ntarget = { connection = "nsb", flavor = "sqlserver" }\nmapping = "m.toml"\n')
    from bridge.commands.main import main

    assert main(["init", "-c", str(tmp_path / "c.toml"), "--print-sql"]) == 0
    sql = capsys.readouterr().out
    assert "-- connection 'legacy'" in sql and f"CREATE TABLE jms.{MARKS}" in sql
    assert main(["rollback", "-c", str(tmp_path / "c.toml"), "--job", "j", "--print-sql"]) == 0
    sql = capsys.readouterr().out
    assert "INSERT INTO dbo.qbridge_givebacks" in sql and MARKS in sql


def _one_moved(request, tmp_path: Path, pg_server: str, pg_schema: str, mapping: str) -> Jms:
    """A move-mode OpenJMS queue on PostgreSQL with `mapping`, whose one message was delivered and consumed."""
    j = Jms(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, system="openjms",
            queues=["orders"], mapping=mapping, mode="move")
    j.seed()
    request.addfinalizer(j.dispose)
    assert j.cli("init") == 0
    j.queue_message("ID:m-1")
    assert j.cli("sync", "--once") == 0
    return j


@pytest.mark.postgres
def test_a_message_whose_mapping_dropped_what_rebuilding_it_needs_stays_delivered(request, tmp_path: Path,
                                                                                  pg_server: str, pg_schema: str,
                                                                                  capsys) -> None:
    from tests.systems.test_openjms_source import MAPPING

    mapping = MAPPING + '\n[headers.drop]\nnames = ["JMS.PropertyTypes", "JMS.BodyKind"]\n'
    j = _one_moved(request, tmp_path, pg_server, pg_schema, mapping)
    capsys.readouterr()
    assert j.cli("rollback", "--yes", "--job", "job1", "--json") == 0
    [w] = json.loads(capsys.readouterr().out)["queues"]
    assert (w["withdrawn"], w["kept"], w["unsure"]) == (0, 1, 1)
    assert j.count("Orders") == 1 and not _handles(j)


def test_move_mode_deletes_every_message_no_handle_holds_when_a_batch_spans_subscribers(jms: Jms) -> None:
    """One pass consumes handles of two durable subscribers, each of a message of its own: both
    messages go with their last handle, as OpenJMS deletes them."""
    from bridge.demo.samples import openjms_message

    topic = blob("real0761_text_durable_topic_overflowed_expiration.bin")
    jms.store(lambda c, t: openjms_message(c, t, "ID:a", TOPIC_ID, topic, [SUBSCRIBERS["billing-sub"]]))
    jms.store(lambda c, t: openjms_message(c, t, "ID:b", TOPIC_ID, topic, [SUBSCRIBERS["audit-sub"]], accepted=2))
    assert jms.cli("sync", "--once") == 0
    assert not _handles(jms) and not _blobs(jms)


@pytest.mark.postgres
def test_a_property_the_mapping_dropped_keeps_the_message_delivered_with_the_reason(request, tmp_path: Path,
                                                                                   pg_server: str, pg_schema: str,
                                                                                   capsys) -> None:
    """Issue 35, finding 3: the mapping drops `JMS.Property.quantity` but keeps `JMS.PropertyTypes`,
    which still names it. Given back, the message would lack `quantity` and nothing would say so:
    it stays delivered, counted as unsure, with the reason."""
    from tests.systems.test_openjms_source import MAPPING

    mapping = MAPPING + '\n[headers.drop]\nnames = ["JMS.Property.quantity"]\n'
    j = _one_moved(request, tmp_path, pg_server, pg_schema, mapping)
    [row] = j.rows("Orders")
    assert "quantity" in row["headers"]["JMS.PropertyTypes"] and "JMS.Property.quantity" not in row["headers"]
    capsys.readouterr()
    assert j.cli("rollback", "--yes", "--job", "job1", "--json") == 0
    [w] = json.loads(capsys.readouterr().out)["queues"]
    assert (w["withdrawn"], w["kept"], w["unsure"], w["given_back"]) == (0, 1, 1, 0)
    [why] = w["unsure_reasons"]
    assert "JMS.Property.quantity" in why and "JMS.PropertyTypes" in why
    assert j.count("Orders") == 1 and not _handles(j)
    assert j.cli("rollback", "--yes", "--job", "job1") == 0
    assert "1 kept delivered: the mapping dropped JMS.Property.quantity" in capsys.readouterr().out
