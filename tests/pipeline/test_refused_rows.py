"""A value the target cannot store costs its row, never the batch (issue 45, finding 1): a lone
UTF-16 surrogate Java wrote into an OpenJMS property or a BizTalk context value, a NUL bound for a
PostgreSQL text column. Such a row is quarantined with what was refused; the rows beside it are
delivered, in both lanes, and the queue is never stalled. A scan source reads a bad row in every
batch: before the fix, three OpenJMS messages with a bad middle one were 0 delivered, 0
quarantined, `sync --once` exit 1 on every run."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs.openjms_blob import decode
from bridge.codecs.openjms_encode import encode
from bridge.demo.samples import biztalk_message, biztalk_store, nginn_row, openjms_destination, openjms_message, openjms_store
from bridge.codecs.jsonsafe import raw_json, writable
from bridge.pipeline.refusals import refused, unstorable
from helpers import Bridge
from nsb_endpoint import Endpoint

FIXTURES = Path(__file__).parents[1] / "fixtures"
JMS = decode((FIXTURES / "openjms" / "text_simple.bin").read_bytes())
LONE = "AC\ud800ME"  # a high surrogate with no low one after it: Java's String holds it, UTF-8 cannot
CTX = (FIXTURES / "biztalk" / "ctx_receive.bin").read_bytes()
# CustomerName ends in U+1F600, stored as the UTF-16LE pair 3D D8 00 DE: its low half made an "A"
# leaves the high one alone.
CTX_LONE = CTX.replace(b"\x3d\xd8\x00\xde", b"\x3d\xd8\x41\x00", 1)
assert CTX_LONE != CTX
PART = ("body", [(FIXTURES / "biztalk" / "part_small_compressed.bin").read_bytes()], 2146)
pytestmark = pytest.mark.postgres
counter = itertools.count()


def jms_blob(poison: str | None) -> bytes:
    if poison == "property":
        return encode(dataclasses.replace(JMS, properties={**JMS.properties, "customer": {"type": "java.lang.String", "value": LONE}}))
    if poison == "correlation":
        return encode(dataclasses.replace(JMS, headers={**JMS.headers, "JMSCorrelationID": LONE}))
    if poison == "type":
        return encode(dataclasses.replace(JMS, headers={**JMS.headers, "JMSType": "Orders." + LONE}))
    if poison == "nul":  # a NUL is JSON-escaped in the header text: every target stores it
        return encode(dataclasses.replace(JMS, properties={**JMS.properties, "customer": {"type": "java.lang.String", "value": "a\x00b"}}))
    return encode(JMS)


class Jms(Bridge):
    def setup(self) -> None:
        with self.source.begin() as conn:
            conn.execute(sa.text(f'SET search_path TO "{self.source_schema}"'))
            self.t = openjms_store(conn)
            openjms_destination(conn, self.t, "orders", 1, True)

    def add(self, blobs: list[bytes]) -> list[str]:
        ids = [f"ID:m-{next(counter)}" for _ in blobs]
        with self.source.begin() as conn:
            conn.execute(sa.text(f'SET search_path TO "{self.source_schema}"'))
            for mid, blob in zip(ids, blobs):
                openjms_message(conn, self.t, mid, 1, blob, [100])
        return ids


MAPPING = '[routes]\n"orders" = "Orders"\n"*" = "Unrouted"\n'


@pytest.fixture()
def jms(tmp_path: Path, pg_server: str, pg_schema: str, pg_schema2: str) -> Iterator[Jms]:
    j = Jms(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema2, system="openjms",
            queues=["orders"], mapping=MAPPING)
    j.setup()
    assert j.cli("init") == 0
    yield j
    j.dispose()


def test_three_openjms_messages_with_a_lone_surrogate_in_the_middle_one(jms: Jms) -> None:
    """The issue's reproduction through the command: two delivered, one quarantined naming the
    header, verify balanced; the next pass finds nothing to do and exits 0 too."""
    jms.add([jms_blob(None), jms_blob("property"), jms_blob(None)])
    assert jms.cli("sync", "--once") == 0
    assert jms.count("Orders") == 2
    assert jms.cli("sync", "--once") == 0
    assert jms.count("Orders") == 2
    [q] = _quarantined(jms)
    assert "JMS.Property.customer" in q["reason"] and "lone UTF-16 surrogate (U+D800" in q["reason"]
    assert jms.cli("verify") == 0


def _quarantined(b: Bridge) -> list[dict[str, Any]]:
    with b.target.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(f'select * from "{b.target_schema}".qbridge_quarantine')).mappings()]


@pytest.mark.parametrize("columnar", [True, False])
def test_each_refused_value_is_one_quarantined_row_in_both_lanes(jms: Jms, columnar: bool) -> None:
    poisons = ["property", "correlation", "type", "nul"]
    blobs = [jms_blob(None), *(jms_blob(p) for p in poisons), *(jms_blob(None) for _ in range(70))]
    ids = jms.add(blobs)
    runner = jms.runner()
    runner.columnar, runner.lane_min_rows = columnar, 1
    stats = runner.run_pass("orders")
    assert (stats.delivered, stats.quarantined) == (len(blobs) - 3, 3)
    bad = {r["source_key"].split("#")[0] for r in _quarantined(jms)}
    assert bad == {ids[1], ids[2], ids[3]}
    got = [r["headers"] for r in jms.rows("Orders")]
    assert sorted(h["QBridge.Source"].split("/")[-1].split("#")[0]
                  for h in got) == sorted(i for i in ids if i not in bad)
    nul = next(h for h in got if h.get("JMS.Property.customer") == "a\x00b")  # stored and read back as it was
    assert nul["NServiceBus.EnclosedMessageTypes"]
    assert jms.cli("verify") == 0


# -- every source: a hypothesis test ---------------------------------------------------------
@st.composite
def batches(draw: Any, poisons: list[str | None]) -> tuple[list[str | None], bool]:
    return draw(st.lists(st.sampled_from(poisons), min_size=1, max_size=12)), draw(st.booleans())


def _settles(b: Bridge, queue: str, expected_bad: int, total: int, columnar: bool) -> None:
    runner = b.runner()
    runner.columnar, runner.lane_min_rows = columnar, 1
    stats = runner.run_pass(queue)  # raises if the batch does not commit
    assert stats.delivered + stats.quarantined + stats.skipped == total, stats
    assert stats.quarantined == expected_bad, stats


HYPO = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


@HYPO
@given(batch=batches(["property", "correlation", "type", "nul", None, None]))
def test_openjms_batches_with_values_no_encoder_takes_commit(jms: Jms, batch: tuple[list[str | None], bool]) -> None:
    poisons, columnar = batch
    jms.add([jms_blob(p) for p in poisons])
    _settles(jms, "orders", sum(p not in (None, "nul") for p in poisons), len(poisons), columnar)


class BizTalk(Bridge):
    def setup(self) -> None:
        self.bt = biztalk_store(self.source, ["App"], self.source_schema)

    def add(self, contexts: list[bytes]) -> None:
        with self.source.begin() as conn:
            for ctx in contexts:
                biztalk_message(conn, self.bt, ctx, [PART], host="App")


@HYPO
@given(batch=batches(["lone", None, None]))
def test_biztalk_batches_with_values_no_encoder_takes_commit(tmp_path: Path, pg_server: str, pg_schema: str,
                                                             batch: tuple[list[str | None], bool]) -> None:
    poisons, columnar = batch
    b = _biztalk(tmp_path, pg_server, pg_schema)
    b.add([CTX_LONE if p else CTX for p in poisons])
    _settles(b, "App", poisons.count("lone"), len(poisons), columnar)
    assert b.cli("verify") == 0


_made: dict[str, BizTalk] = {}


def _biztalk(tmp_path: Path, url: str, schema: str) -> BizTalk:
    """One store per test (hypothesis runs its examples in the one function-scoped schema)."""
    if schema not in _made:
        b = BizTalk(tmp_path, url, url, source_schema=schema, target_schema=schema, system="biztalk", queues=["App"],
                    mapping='[routes]\n"*" = "Orders"\n[biztalk]\nnamespaces = { "http://example.org/orders/properties" = "Orders" }\n')
        b.setup()
        assert b.cli("init") == 0
        _made[schema] = b
    return _made[schema]


@HYPO
@given(batch=batches(["nul name", "nul value", "emoji", None]))
def test_nginn_batches_with_nuls_and_astral_characters_commit(tmp_path: Path, pg_server: str, pg_schema: str,
                                                              batch: tuple[list[str | None], bool]) -> None:
    """NGinn's text comes from a database, which holds no lone surrogate; a NUL (SQLite and SQL
    Server keep one in text) and a character beyond the BMP are JSON-escaped and delivered, in
    the NServiceBus header text PostgreSQL stores."""
    poisons, columnar = batch
    key = f"nginn-{pg_schema}"
    if key not in _made:  # the legacy side on SQLite, whose text holds a NUL (PostgreSQL's does not)
        _made[key] = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", pg_server, target_schema=pg_schema)
        assert _made[key].cli("init") == 0
    b = _made[key]
    headers = {"nul name": "Te\x00nant=acme", "nul value": "Tenant=ac\x00me", "emoji": "Tenant=\U0001f600", None: "Tenant=acme"}
    rows = [nginn_row("MQueue1", i, b.now_local(), headers=headers[p]) for i, p in enumerate(poisons)]
    b.insert(rows)
    _settles(b, "MQueue1", 0, len(poisons), columnar)


@given(batch=batches(["nul value", "nul name", None, None]))
@HYPO
def test_reverse_batches_with_values_the_legacy_columns_refuse_commit(tmp_path: Path, pg_server: str, pg_schema: str,
                                                                      pg_schema2: str, batch: tuple[list[str | None], bool]) -> None:
    """NServiceBus -> NGinn on PostgreSQL: a header holding a NUL, which NServiceBus's JSON
    carries and NGinn's msg_headers (text) cannot, quarantines its message alone."""
    poisons, _ = batch
    key = f"reverse-{pg_schema}"
    if key not in _made:
        _made[key] = _reverse(tmp_path, pg_server, pg_schema, pg_schema2)
    b = _made[key]
    endpoint = Endpoint(b.target, pg_schema2, "Shop")
    for p in poisons:
        extra = {"nul value": {"Tenant": "ac\x00me"}, "nul name": {"Ten\x00ant": "acme"}, None: {"Tenant": "acme"}}[p]
        endpoint.send(endpoint.address("Sender"), endpoint.headers("Orders.OrderAccepted, Orders", "Send", **extra), b"{}")
    _settles(b, "Sender", sum(p is not None for p in poisons), len(poisons), False)


def _reverse(tmp_path: Path, url: str, legacy: str, nsb: str) -> Bridge:
    from bridge.demo.samples import create_nginn_queue

    b = Bridge(tmp_path, url, url, source_schema=legacy, target_schema=nsb, queues=["Sender"],
               mapping='[routes]\n"Sender" = "Sender"\n[types]\n"Orders.OrderAccepted, Orders" = "Orders.OrderAccepted"\n')
    create_nginn_queue(b.source, "Sender", legacy)
    b.config.write_text(f"""
[connections]
legacy = "{url}"
nsb = "{url}"

[[jobs]]
name = "job1"
source = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{nsb}", queues = ["Sender"] }}
target = {{ system = "nginn", connection = "legacy", timezone = "Europe/Warsaw", schema = "{legacy}", database = "shop", alias = "db" }}
mapping = "mapping.toml"
""")
    assert b.cli("init") == 0
    return b


# -- the pieces ----------------------------------------------------------------------------
def test_what_counts_as_a_refusal() -> None:
    assert refused(TypeError("str is not valid UTF-8: surrogates not allowed"))
    assert refused(sa.exc.DataError("INSERT", {}, Exception("value too long for type character varying(100)")))
    # a constraint is the table's: every row breaks it (a NOT NULL column qbridge does not write)
    assert not refused(sa.exc.IntegrityError("INSERT", {}, Exception('null value in column "x" violates not-null constraint')))
    assert not refused(sa.exc.OperationalError("INSERT", {}, Exception("server closed the connection unexpectedly")))
    from bridge.errors import TargetSchemaError

    assert not refused(TargetSchemaError("target table 'Orders' does not exist"))


def test_a_refused_value_is_named_in_words_every_database_stores() -> None:
    assert unstorable({"headers": {"a": "ok", "b": "x\ud800"}}) == "['headers']['b'] holds a lone UTF-16 surrogate (U+D800 at character 1)"
    assert unstorable(("ok", "a\x00")) == "[1] holds a NUL character (at character 1)"
    assert unstorable({"fine": "zażółć \U0001f600"}) is None
    assert writable("x\ud800\x00y") == "x\\ud800\\x00y"
    assert writable("x\ud800").encode("utf-8")
    assert orjson.loads(raw_json({"k": "x\ud800", "n": [1, "a\x00"]})) == {"k": "x\\ud800", "n": [1, "a\x00"]}


def test_a_replay_of_a_refused_message_leaves_it_in_quarantine_with_the_reason(jms: Jms, capsys: pytest.CaptureFixture[str]) -> None:
    jms.add([jms_blob("property")])
    assert jms.cli("sync", "--once") == 0
    capsys.readouterr()
    assert jms.cli("quarantine", "replay", "--all", "--json") == 1  # a replay that failed
    [row] = orjson.loads(capsys.readouterr().out)["results"]
    assert row["action"] == "replay-failed" and "lone UTF-16 surrogate" in row["detail"]
    assert len(_quarantined(jms)) == 1 and jms.count("Orders") == 0
