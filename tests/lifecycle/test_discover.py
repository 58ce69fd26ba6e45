"""`qbridge discover` (issue 28): what a legacy database holds, found by columns and tables, with
counts and the types of a bounded sample; `--write DIR` a starter config that works as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.commands.main import main as cli
from bridge.db import engine_for
from bridge.demo.run import build
from bridge.lifecycle.discover import discover
from bridge.demo.samples import nginn_row
from helpers import Bridge
from tests.systems.test_openjms_source import SUBSCRIBERS, TOPIC_ID, blob, make_jms


@pytest.fixture()
def demo(tmp_path: Path) -> Path:
    build(tmp_path)
    return tmp_path


def _by_name(found) -> dict:
    return {q.name: q for q in found.queues}


def test_the_demo_stores_are_found_with_counts_types_and_subscriptions(demo: Path) -> None:
    nginn = discover(engine_for(f"sqlite:///{demo}/legacy-nginn.db"))
    q = _by_name(nginn)
    assert set(q) == {"MQueue1", "MQueue2"}
    assert q["MQueue1"].system == "nginn" and sum(q["MQueue1"].states.values()) == 26
    assert q["MQueue1"].states["processed"] == 1 and q["MQueue1"].pending == 25
    assert q["MQueue1"].types == {"Orders.PlaceOrder, Orders": 24} and q["MQueue1"].unreadable == 2
    assert q["MQueue1"].sampled == 26
    assert nginn.subscriptions == [{"endpoint": "MQueue2", "topic": "Orders.PlaceOrder"}]

    jms = _by_name(discover(engine_for(f"sqlite:///{demo}/legacy-openjms.db")))
    assert (jms["orders"].kind, jms["orders"].states, jms["orders"].unreadable) == ("queue", {"ready": 3}, 1)
    assert jms["prices.eu"].kind == "topic" and jms["prices.eu"].consumers == ["archive-sub", "billing-sub"]
    assert "Orders.PlaceOrder" in jms["orders"].types

    [host] = discover(engine_for(f"sqlite:///{demo}/legacy-biztalk.db")).queues
    assert (host.system, host.name, host.kind, host.states) == ("biztalk", "BizTalkServerApplication", "host",
                                                               {"ready": 2, "suspended": 1})
    assert host.types == {"http://example.org/orders#Order": 3}


def test_the_sample_is_bounded_and_says_so(demo: Path, capsys) -> None:
    assert cli(["discover", f"sqlite:///{demo}/legacy-nginn.db", "--sample", "5", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    q = {x["name"]: x for x in found["queues"]}
    assert found["sample"] == 5 and q["MQueue1"]["sampled"] == 5 and sum(q["MQueue1"]["types"].values()) <= 5
    assert q["MQueue1"]["states"]["ready"] > 5  # counts are not sampled


@pytest.mark.parametrize("store", ["nginn", "openjms", "biztalk"])
def test_the_written_starter_config_migrates_as_it_is(demo: Path, tmp_path: Path, store: str, capsys) -> None:
    out = tmp_path / f"starter-{store}"
    assert cli(["discover", f"sqlite:///{demo}/legacy-{store}.db", "--write", str(out)]) == 0
    config = out / "config.toml"
    assert f"wrote {config}" in " ".join(capsys.readouterr().err.split())
    mapping = (out / f"mapping-{store}.toml").read_text()
    assert "[types]" in mapping and "TODO: the NServiceBus type" in mapping
    assert cli(["init", "-c", str(config)]) == 0
    assert cli(["sync", "--once", "-c", str(config)]) == 0
    assert cli(["verify", "-c", str(config)]) == 0


def test_an_nginn_queue_in_a_postgresql_schema_and_a_password_never_printed(pg_server: str, pg_schema: str,
                                                                           tmp_path: Path, capsys) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, queues=["Inbox"])
    now = b.now_local()
    b.insert([nginn_row("Inbox", i, now, subqueue="X" if i == 3 else "I") for i in range(1, 6)], queue="Inbox")
    url = sa.engine.make_url(pg_server).set(username="postgres", password="s3cret-pw").render_as_string(hide_password=False)
    assert cli(["discover", url, "--schema", pg_schema, "--write", str(tmp_path / "w")]) == 0
    captured = capsys.readouterr()
    assert "s3cret-pw" not in captured.out + captured.err
    assert "Inbox" in captured.out and "ready 4" in captured.out and "processed 1" in captured.out
    config = (tmp_path / "w" / "config.toml").read_text()
    assert "s3cret-pw" not in config and "${QBRIDGE_LEGACY_PASSWORD}" in config
    assert f'schema = "{pg_schema}"' in config
    b.dispose()


@pytest.mark.parametrize("kind", ["postgres", "mariadb"])
def test_an_openjms_store_on_postgresql_and_mariadb(kind: str, request, tmp_path: Path, pg_server: str, pg_schema: str) -> None:
    for j in make_jms(kind, request, tmp_path, pg_server, pg_schema):
        j.queue_message("ID:q-1")
        j.queue_message("ID:q-2")
        j.store(lambda c, t: j_message(c, t))
        found = _by_name(discover(engine_for(j.source_url), j.source_schema))
        assert found["orders"].states == {"ready": 2} and found["orders"].types == {"Orders.PlaceOrder": 2}
        assert found["prices.eu"].kind == "topic" and sorted(found["prices.eu"].consumers) == sorted(SUBSCRIBERS)
        assert found["prices.eu"].states == {"ready": 2}
        assert found["binary.in"].states == {"ready": 0}


def j_message(conn, t) -> None:
    from bridge.demo.samples import openjms_message

    openjms_message(conn, t, "ID:t-1", TOPIC_ID, blob("text_simple.bin"), list(SUBSCRIBERS.values()))


def test_nothing_found_and_a_bad_url_get_clear_messages(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.db"
    sa.create_engine(f"sqlite:///{empty}").connect().close()
    assert cli(["discover", f"sqlite:///{empty}"]) == 1
    assert "no NGinn queue table, OpenJMS store or BizTalk host found" in capsys.readouterr().err
    assert cli(["discover", "not a url"]) == 2
    assert "is not a database URL" in capsys.readouterr().err
    assert cli(["discover", f"sqlite:///{empty}", "--write", str(tmp_path / "w")]) == 2
    assert not (tmp_path / "w").exists()
