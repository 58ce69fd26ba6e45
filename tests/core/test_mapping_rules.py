"""Mapping rules by pattern and by content (issue 47, the first rule kinds): `[[types.rules]]`
(regex, groups, a chain), `[[routes.rules]]` and `[[skip]]` with a CEL `when` over the legacy
message as read; each through `qbridge init`, `sync --once` and `verify` on SQLite, PostgreSQL and
MariaDB legacy databases; and every bad rule is a located error, exit 2, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.demo.samples import nginn_body, nginn_row
from helpers import Bridge
from tests.systems.test_reverse_nginn import two_way  # noqa: F401 - the fixture

STORY = r"""
[routes]
"MQueue1" = "Orders"

[[routes.rules]]
when = 'headers["Region"] == "eu"'
to = "OrdersEU"

[[types.rules]]
match = '^NGinn\.Shop\.(\w+), NGinn\.Shop$'
to = 'Shop.Messages.\1, Shop.Messages'

[[types.rules]]
match = '^Legacy\.(\w+)$'
to = ['Shop.Messages.\1, Shop.Messages', 'Shop.Messages.IEvent, Shop.Messages']

[[skip]]
name = "test traffic"
when = '"X-Test" in headers && headers["X-Test"] == "true"'

[[skip]]
name = "big test orders"
when = 'type.startsWith("NGinn.Shop.") && has(body.Test) && body.Test == true'
"""


def _rows(b: Bridge) -> list[dict]:
    now = b.now_local()
    return [
        nginn_row("MQueue1", 1, now, headers="Region=eu", body=nginn_body("NGinn.Shop.PlaceOrder, NGinn.Shop", OrderNo=1)),
        nginn_row("MQueue1", 2, now, headers="Region=us", body=nginn_body("NGinn.Shop.PlaceOrder, NGinn.Shop", OrderNo=2)),
        nginn_row("MQueue1", 3, now, headers="X-Test=true|Region=eu", body=nginn_body("NGinn.Shop.PlaceOrder, NGinn.Shop")),
        nginn_row("MQueue1", 4, now, headers="", body=nginn_body("Legacy.PriceChanged", Price=3)),
        nginn_row("MQueue1", 5, now, headers="", body=nginn_body("NGinn.Shop.CancelOrder, NGinn.Shop", Test=True)),
        nginn_row("MQueue1", 6, now, headers="", body=nginn_body("Other.Thing, Other")),
    ]


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def story(request: pytest.FixtureRequest, tmp_path: Path) -> Bridge:
    target = f"sqlite:///{tmp_path}/n.db"
    if request.param == "sqlite":
        b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", target, mapping=STORY)
    elif request.param == "postgres":
        b = Bridge(tmp_path, request.getfixturevalue("pg_server"), target, source_schema=request.getfixturevalue("pg_schema"),
                   mapping=STORY)
    else:
        b = Bridge(tmp_path, request.getfixturevalue("mariadb_database"), target, mapping=STORY)
    assert b.cli("init") == 0
    return b


def test_type_route_and_skip_rules_through_sync_and_verify(story: Bridge, capsys: pytest.CaptureFixture[str]) -> None:
    b = story
    b.insert(_rows(b))
    assert b.cli("sync", "--once") == 0
    eu, rest = b.rows("OrdersEU"), b.rows("Orders")
    types = {r["headers"]["NServiceBus.CorrelationId"]: r["headers"]["NServiceBus.EnclosedMessageTypes"] for r in eu + rest}
    assert [r["headers"]["NServiceBus.CorrelationId"] for r in eu] == ["corr-1"]  # routed by its header
    assert sorted(r["headers"]["NServiceBus.CorrelationId"] for r in rest) == ["corr-2", "corr-4", "corr-6"]
    assert types["corr-1"] == "Shop.Messages.PlaceOrder, Shop.Messages"  # a type rule with a group
    assert types["corr-4"] == "Shop.Messages.PriceChanged, Shop.Messages;Shop.Messages.IEvent, Shop.Messages"  # a chain
    assert types["corr-6"] == "Other.Thing, Other"  # no rule matched: as it was
    assert b.ledger() == {"delivered": 4, "skipped": 2}
    capsys.readouterr()
    assert b.cli("verify", "--json") == 0
    import json

    [q] = json.loads(capsys.readouterr().out)["jobs"][0]["queues"]
    assert q["skipped_by_rule"] == {"skip 'test traffic'": 1, "skip 'big test orders'": 1}, q


BAD = {
    "a regex that does not compile": ("[[types.rules]]\nmatch = '(unclosed'\nto = 'X'\n", "types.rules[0]", "not a regular expression"),
    "a group the regex lacks": ("[[types.rules]]\nmatch = '^A\\.(\\w+)$'\nto = 'B.\\2'\n", "types.rules[0]", "names group \\2"),
    "a when that does not compile": ("[[routes.rules]]\nwhen = 'headers['\nto = 'Orders'\n", "routes.rules[0].when", "does not compile"),
    "a when that does not type-check": ("[[skip]]\nname = 'x'\nwhen = 'queue == 1'\n", "skip[0].when", "no matching overload"),
    "a when that is no bool": ("[[skip]]\nname = 'x'\nwhen = 'type'\n", "skip[0].when", "must be true or false"),
    "a variable that does not exist": ("[[skip]]\nname = 'x'\nwhen = 'nosuch == \"a\"'\n", "skip[0].when", "undeclared reference to 'nosuch'"),
    "an unknown key in a rule": ("[[routes.rules]]\nto = 'Orders'\nwhere = 'x'\n", "routes.rules[0].where", "unknown key"),
    "a skip rule without a name": ("[[skip]]\nwhen = 'true'\n", "skip[0].name", "required key is missing"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_rule_is_a_located_error_before_anything_runs(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, where, what = BAD[case]
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", mapping='[routes]\n"*" = "Orders"\n' + text)
    b.insert(b.ready(1))
    assert b.cli("sync", "--once") == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "mapping.toml" in said and where in said and what in said, said
    assert not (tmp_path / "n.db").exists() or b.count("Orders") == 0


RESHAPE = r"""
[routes]
"*" = "Orders"

[[body]]
when = 'type.startsWith("NGinn.Shop.")'
strip_types = true
rename = { "OrderNo" = "OrderId", "Customer.Nm" = "Name" }
delete = ["Internal.Audit"]
set = { "SchemaVersion" = 2, "Meta.Source" = "nginn" }

[[body]]
when = 'type == "Wrapped.Envelope, Wrapped"'
unwrap = "message"

[[headers.rules]]
when = 'queue == "MQueue1"'
set = { "NServiceBus.OriginatingEndpoint" = "Legacy.Shop", "Acme.Queue" = "{queue}" }
from_body = { "NServiceBus.ConversationId" = "ConversationId" }
replace = { "NServiceBus.ReplyToAddress" = ['^"?Sender.*$', 'Sender.Migrated'] }

[[ttbr]]
when = 'type.startsWith("NGinn.Shop.PriceChanged")'
set = "00:10:00"

[[ttbr]]
when = 'type.startsWith("NGinn.Shop.")'
set = "none"

[[transforms]]
use = "tests.plugin_sample:fix_order"
when = 'type.startsWith("NGinn.Shop.")'
"""


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def reshaping(request: pytest.FixtureRequest, tmp_path: Path) -> Bridge:
    target = f"sqlite:///{tmp_path}/n.db"
    kw = {"mapping": RESHAPE, "extra": "plugins = true\n"}
    if request.param == "sqlite":
        b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", target, **kw)
    elif request.param == "postgres":
        b = Bridge(tmp_path, request.getfixturevalue("pg_server"), target, source_schema=request.getfixturevalue("pg_schema"), **kw)
    else:
        b = Bridge(tmp_path, request.getfixturevalue("mariadb_database"), target, **kw)
    assert b.cli("init") == 0
    return b


def test_body_header_ttbr_and_plugin_rules_through_sync(reshaping: Bridge) -> None:
    import orjson

    b = reshaping
    now = b.now_local()
    shop = "NGinn.Shop.PlaceOrder, NGinn.Shop"
    b.insert([
        nginn_row("MQueue1", 1, now, body=nginn_body(shop, OrderNo=7, ConversationId="conv-7", Customer={"$type": "C", "Nm": "Ann"},
                                                         Internal={"Audit": "x", "Keep": 1})),
        nginn_row("MQueue1", 2, now, body=nginn_body("NGinn.Shop.PriceChanged, NGinn.Shop", Price=3)),
        nginn_row("MQueue1", 3, now, body=orjson.dumps({"$type": "Wrapped.Envelope, Wrapped", "message": {"A": 1}}).decode()),
        nginn_row("MQueue1", 4, now, body=nginn_body(shop, Cancelled=True)),                      # the plugin skips it
        nginn_row("MQueue1", 5, now, body=nginn_body(shop, Explode=True)),                        # the plugin raises
        nginn_row("MQueue1", 6, now, body=nginn_body(shop, ConversationId={"not": "scalar"})),    # from_body: no scalar
    ])
    assert b.cli("sync", "--once") == 0
    rows = {r["headers"]["NServiceBus.CorrelationId"]: r for r in b.rows("Orders")}
    assert sorted(rows) == ["corr-1", "corr-2", "corr-3"]
    one = rows["corr-1"]
    assert orjson.loads(one["body"]) == {"OrderId": 7, "ConversationId": "conv-7", "Customer": {"Name": "Ann"},
                                         "Internal": {"Keep": 1}, "SchemaVersion": 2, "Meta": {"Source": "nginn"}, "Fixed": True}
    h = one["headers"]
    assert h["NServiceBus.OriginatingEndpoint"] == "Legacy.Shop" and h["Acme.Queue"] == "MQueue1" and h["Acme.Fixed"] == "yes"
    assert h["NServiceBus.ConversationId"] == "conv-7"
    assert "NServiceBus.TimeToBeReceived" not in h and one["expires"] is None  # ttbr "none"
    two = rows["corr-2"]
    assert two["headers"]["NServiceBus.TimeToBeReceived"] == "00:10:00" and two["expires"] is not None
    assert orjson.loads(rows["corr-3"]["body"]) == {"A": 1}  # unwrapped
    assert b.ledger() == {"delivered": 3, "skipped": 1, "quarantined": 2}
    with b.target.connect() as conn:
        import sqlalchemy as sa

        reasons = sorted(r[0] for r in conn.execute(sa.text("select reason from qbridge_quarantine")))
    assert any("transforms[0] (tests.plugin_sample:fix_order) raised ValueError: cannot fix an exploding order" in r for r in reasons), reasons
    assert any("headers.rules[0].from_body 'NServiceBus.ConversationId'" in r and "not a string" in r for r in reasons), reasons


MORE_BAD = {
    "a body rule that does nothing": ("[[body]]\nwhen = 'true'\n", "body[0]", "does nothing"),
    "a rename to a path": ("[[body]]\nrename = { 'A' = 'B.C' }\n", "body[0]", "a name at the same level"),
    "a ttbr that is no TimeSpan": ("[[ttbr]]\nset = '10 minutes'\n", "ttbr[0].set", "no TimeSpan"),
    "a replace whose regex does not compile": ("[[headers.rules]]\nreplace = { 'H' = ['(', 'x'] }\n", "headers.rules[0]",
                                               "not a regular expression"),
    "a header template with an unknown placeholder": ("[[headers.rules]]\nset = { 'H' = '{nope}' }\n", "headers.rules[0]",
                                                      "unknown placeholder"),
    "plugins the job does not allow": ("[[transforms]]\nuse = 'tests.plugin_sample:fix_order'\n", "plugins = true", "runs code"),
}


@pytest.mark.parametrize("case", list(MORE_BAD))
def test_more_bad_rules_are_located_errors(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, where, what = MORE_BAD[case]
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", mapping='[routes]\n"*" = "Orders"\n' + text)
    assert b.cli("sync", "--once") == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "mapping.toml" in said and where in said and what in said, said


def test_a_plugin_that_does_not_resolve_is_a_located_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", extra="plugins = true\n",
               mapping='[routes]\n"*" = "Orders"\n[[transforms]]\nuse = "tests.plugin_sample:nope"\n')
    assert b.cli("sync", "--once") == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "transforms[0].use" in said and "has no 'nope'" in said, said


def test_map_shows_one_row_and_preview_counts_each_rule(story: Bridge, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    b = story
    ids = b.insert(_rows(b))
    capsys.readouterr()
    assert b.cli("map", "--job", "job1", "--queue", "MQueue1", "--key", str(ids[0]), "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["outcome"] == "delivered" and shown["table"] == "OrdersEU", shown
    assert shown["rules"] == ["types.rules[0]", "routes.rules[0]"], shown
    assert shown["headers"]["NServiceBus.EnclosedMessageTypes"] == "Shop.Messages.PlaceOrder, Shop.Messages"
    assert shown["body"]["OrderNo"] == 1
    assert b.cli("map", "--job", "job1", "--queue", "MQueue1", "--key", str(ids[2])) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "skipped: skip 'test traffic'" in said and "rules applied: skip[0] 'test traffic'" in said, said
    assert b.cli("map", "--job", "job1", "--queue", "MQueue1", "--key", "999999") == 1  # no such row
    assert b.count("OrdersEU") == 0 and b.ledger() == {}  # map writes nothing
    capsys.readouterr()
    assert b.cli("preview", "--json") == 0
    [q] = json.loads(capsys.readouterr().out)["jobs"][0]["queues"]
    assert q["rules"] == {"types.rules[0]": 2, "routes.rules[0]": 1, "types.rules[1]": 1, "skip[0] 'test traffic'": 1,
                          "skip[1] 'big test orders'": 1}, q["rules"]
    assert q["rule_examples"]["routes.rules[0]"] == str(ids[0])
    assert q["skipped"] == {"skip 'test traffic'": 1, "skip 'big test orders'": 1}


def test_rules_in_a_reverse_jobs_mapping_are_a_located_error(two_way, capsys: pytest.CaptureFixture[str]) -> None:
    tw = two_way()
    (tw.tmp / "reverse.toml").write_text((tw.tmp / "reverse.toml").read_text() + "\n[[skip]]\nname = 'x'\nwhen = 'true'\n")
    assert tw.cli("sync", "--once") == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "reverse.toml" in said and "skip: jobs[1] ('to-legacy') is a reverse job" in said, said


@pytest.mark.slow
def test_rules_through_migrate_on_spark_run_and_replay(make, tmp_path: Path) -> None:
    """The same rules on Spark's executors (migrate), in `qbridge run`, and in a replay: a message
    a plugin refused is replayed once the plugin is fixed, through the rules in force then."""
    import shutil
    import subprocess

    if shutil.which("java") is None:
        pytest.fail("Java is not installed; Spark needs it")
    b: Bridge = make(mapping=STORY + "\n[[transforms]]\nuse = 'tests.plugin_sample:fix_order'\nwhen = 'true'\n",
                     extra="plugins = true\n")
    rows = _rows(b)
    rows.append(nginn_row("MQueue1", 7, b.now_local(), body=nginn_body("NGinn.Shop.PlaceOrder, NGinn.Shop", Explode=True)))
    b.insert(rows)
    env = {"PYTHONPATH": str(Path(__file__).parents[2])}  # Spark's Python workers import the plugin too
    r = subprocess.run(b.spawn_args("migrate", "--master", "local[2]"), capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, **env})
    assert r.returncode == 0, r.stderr
    assert [x["headers"]["NServiceBus.CorrelationId"] for x in b.rows("OrdersEU")] == ["corr-1"]
    assert sorted(x["headers"]["NServiceBus.CorrelationId"] for x in b.rows("Orders")) == ["corr-2", "corr-4", "corr-6"]
    assert all(x["headers"]["Acme.Fixed"] == "yes" for x in b.rows("Orders"))
    assert b.ledger() == {"delivered": 4, "skipped": 2, "quarantined": 1}
    # qbridge run takes a new row through the same rules
    b.insert([nginn_row("MQueue1", 8, b.now_local(), headers="Region=eu", body=nginn_body("NGinn.Shop.PlaceOrder, NGinn.Shop"))])
    b.config.write_text(b.config.read_text() + 'schedule = { every = "1s" }\n')
    proc = b.spawn("run", env=env)
    try:
        import time

        deadline = time.monotonic() + 60
        while b.count("OrdersEU") < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(60)
    assert sorted(x["headers"]["NServiceBus.CorrelationId"] for x in b.rows("OrdersEU")) == ["corr-1", "corr-8"]
    # the plugin fixed (its when no longer holds for the exploding message): the replay delivers it
    (b.tmp / "mapping.toml").write_text((b.tmp / "mapping.toml").read_text().replace("when = 'true'", "when = '!has(body.Explode)'"))
    assert b.cli("quarantine", "replay", "--job", "job1", "--all") == 0
    assert b.ledger() == {"delivered": 6, "skipped": 2}
    assert "corr-7" in {x["headers"]["NServiceBus.CorrelationId"] for x in b.rows("Orders")}


def test_a_header_rule_that_reads_the_body_leaves_its_bytes_as_they_were(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db",
               mapping='[routes]\n"*" = "Orders"\n[[headers.rules]]\nfrom_body = { "Acme.N" = "N" }\n')
    assert b.cli("init") == 0
    text = '{ "$type" : "A.B, A",  "N": 1.50, "Z":"\\u00e9" }'  # spacing and escapes orjson would not write
    b.insert([nginn_row("MQueue1", 1, b.now_local(), body=text)])
    assert b.cli("sync", "--once") == 0
    [row] = b.rows("Orders")
    assert row["headers"]["Acme.N"] == "1.5" and row["body"] == text.encode()


def test_strip_types_takes_every_type_at_every_level_however_it_is_written() -> None:
    import orjson

    from bridge.mapping_rules import BodyRule
    from bridge.targets.reshape import _body

    rule = BodyRule(strip_types=True)
    for raw, want in ((b'{"$type":"A","L":[{"$type":"B"},{"$type":"C","z":[{"$type":"D","k":1}]}]}', {"L": [{}, {"z": [{"k": 1}]}]}),
                      (b'{"\\u0024type":"A","x":{"$type":"B","y":1}}', {"x": {"y": 1}}),  # an escaped "$" counts too
                      (b'{"a":"$type","b":{"$type":"X"}}', {"a": "$type", "b": {}})):   # a value "$type" is no key
        assert _body(rule, orjson.loads(raw), raw) == want


def test_verify_deep_names_a_plugin_that_is_not_pure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", extra="plugins = true\n",
               mapping='[routes]\n"*" = "Orders"\n[[transforms]]\nuse = "tests.plugin_sample:stamp"\n')
    assert b.cli("init") == 0
    b.insert(b.ready(3))
    assert b.cli("sync", "--once") == 0
    capsys.readouterr()
    assert b.cli("verify", "--deep", "--json") == 1
    [q] = json.loads(capsys.readouterr().out)["jobs"][0]["queues"]
    assert q["deep"]["mismatched"] == 3 and q["deep"]["impure"] == 3, q["deep"]
    assert all("a [[transforms]] plugin that is not pure" in k for k in q["deep"]["mismatched_keys"])
