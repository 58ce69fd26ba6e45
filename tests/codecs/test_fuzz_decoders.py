"""Hypothesis against every decoder: random and mutated legacy input either decodes or fails
with the decoder's own error (which the loop turns into a quarantine reason); it never raises
anything else, never hangs, and never allocates what a forged length field asks for."""

from __future__ import annotations

import struct
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs import biztalk, openjms_blob
from bridge.config import load_config
from bridge.errors import BadRow
from bridge.sources.base import SourceRow
from bridge.sources.nginn import COLUMNS
from helpers import Bridge

FIXTURES = Path(__file__).parents[1] / "fixtures"
OPENJMS = sorted((FIXTURES / "openjms").glob("*.bin"))
CONTEXTS = sorted((FIXTURES / "biztalk").glob("*ctx*.bin"))
PARTS = sorted(p for p in (FIXTURES / "biztalk").glob("*.bin") if "ctx" not in p.name)
FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Path]) -> bytes:
    """A real blob with bytes flipped, inserted, deleted, or cut short, or one length-sized
    field overwritten with a huge value."""
    data = bytearray(draw(st.sampled_from(seeds)).read_bytes())
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "huge"]))
        at = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[at:]
        elif at + 4 <= len(data):
            data[at:at + 4] = struct.pack(draw(st.sampled_from([">i", "<i", ">I", "<I"])), 0x7FFFFFF0)
    return bytes(data)


def _bounded(call, limit_mb: int = 64) -> None:
    """Runs `call`; fails if it allocated more than `limit_mb` at its peak."""
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < limit_mb * 2**20, f"peak allocation {peak / 2**20:.0f} MiB"


# -- OpenJMS messageBlob ------------------------------------------------------------------------
def _openjms(blob: bytes) -> None:
    try:
        openjms_blob.decode(blob)
    except openjms_blob.BlobError as e:
        assert str(e), "an error must say why"


@FUZZ
@given(mutated(OPENJMS))
def test_openjms_mutated_blobs(blob: bytes) -> None:
    _openjms(blob)


@FUZZ
@given(st.binary(max_size=512).map(lambda b: b"\xac\xed\x00\x05" + b))
def test_openjms_random_streams(blob: bytes) -> None:
    _openjms(blob)


@pytest.mark.parametrize("fmt", [">i", ">q", ">H"])
def test_openjms_length_claiming_2gb_is_refused_without_allocating_it(fmt: str) -> None:
    seed = (FIXTURES / "openjms" / "bytes_msg.bin").read_bytes()
    for at in range(4, len(seed) - 8):
        forged = seed[:at] + struct.pack(fmt, 0x7FFFFFFF if fmt != ">H" else 0xFFFF) + seed[at + struct.calcsize(fmt):]
        _bounded(lambda f=forged: _openjms(f))


# -- BizTalk context bags, parts, fragments --------------------------------------------------
def _context(blob: bytes) -> None:
    try:
        biztalk.decode_context(blob)
    except biztalk.BizTalkFormatError as e:
        assert str(e)


def _part(fragments: list[bytes], size: int | None) -> None:
    try:
        biztalk.decode_part(fragments, size)
    except biztalk.BizTalkFormatError as e:
        assert str(e)


@FUZZ
@given(mutated(CONTEXTS))
def test_biztalk_mutated_contexts(blob: bytes) -> None:
    _context(blob)


@FUZZ
@given(st.binary(max_size=512))
def test_biztalk_random_contexts(blob: bytes) -> None:
    _context(blob)


@FUZZ
@given(st.lists(mutated(PARTS), min_size=1, max_size=3), st.one_of(st.none(), st.integers(0, 2**31)))
def test_biztalk_mutated_parts_and_fragments(fragments: list[bytes], size: int | None) -> None:
    _part(fragments, size)


def test_biztalk_lengths_claiming_2gb_are_refused_without_allocating_them() -> None:
    for name in ("ctx_receive.bin", "part_small_compressed.bin", "part_large.bin"):
        seed = (FIXTURES / "biztalk" / name).read_bytes()
        for at in range(0, min(len(seed) - 4, 400)):
            forged = seed[:at] + struct.pack("<I", 0x7FFFFFF0) + seed[at + 4:]
            if "ctx" in name:
                _bounded(lambda f=forged: _context(f))
            else:
                _bounded(lambda f=forged: _part([f], None))


def test_a_zip_bomb_part_is_refused_without_inflating_it() -> None:
    import zlib

    bomb = zlib.compress(b"\0" * (256 * 2**20), 9)  # 256 MiB of zeros in ~250 KB
    block = struct.pack("<III", 1, 1000, len(bomb)) + bomb + struct.pack("<III", 0, 0, 0)
    _bounded(lambda: _part([block], None), limit_mb=32)


# -- NGinn rows ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nginn_source(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("fuzz")
    b = Bridge(tmp, f"sqlite:///{tmp}/l.db", f"sqlite:///{tmp}/n.db")
    config = load_config(b.config)
    from bridge.pipeline.loop import JobRunner

    runner = JobRunner(config, config.jobs[0])
    yield runner.sources["MQueue1"]
    b.dispose()


text = st.one_of(st.none(), st.text(max_size=300), st.sampled_from([
    "", "|", "=", "a=b|c", "_NG-TTL=2026-13-45 99:99:99", "_NG-TTL=", "_NG-ReplyTo=sql://", "x=" + "y" * 5000,
    '{"$type": 5}', '{"$type": "A.B, C"', "[]", "null", '"str"', "{}", '{"$type":"\\ud800"}',
]))


@settings(max_examples=400, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(subqueue=st.one_of(st.sampled_from(["I", "R", "X", "F"]), st.text(max_size=2)), headers=text, body=text,
       error=text, to=text, correlation=text)
def test_nginn_rows_decode_or_are_bad_rows(nginn_source, subqueue, headers, body, error, to, correlation) -> None:
    from datetime import datetime

    values = dict.fromkeys(COLUMNS)
    values.update(id=7, from_endpoint="sql://db/A", to_endpoint=to, subqueue=subqueue, insert_time=datetime(2026, 1, 1),
                  retry_time=datetime(2026, 1, 1), retry_count=0, msg_headers=headers, msg_text=body,
                  error_info=error, correlation_id=correlation)
    try:
        nginn_source.decode(SourceRow(key=7, consumable=True, values=values))
    except BadRow as e:
        assert str(e)


# -- a whole batch of hostile rows ----------------------------------------------------------------
def test_a_batch_of_mutated_openjms_blobs_ends_delivered_or_quarantined_with_reasons(tmp_path: Path) -> None:
    import random

    import sqlalchemy as sa

    from bridge.demo.samples import openjms_destination, openjms_message, openjms_store

    rng = random.Random(7)
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/jms.db", f"sqlite:///{tmp_path}/nsb.db", system="openjms",
               queues=["orders"], mapping='[routes]\n"*" = "Orders"\n')
    with b.source.begin() as conn:
        t = openjms_store(conn)
        openjms_destination(conn, t, "orders", 1, True)
        for i in range(60):
            data = bytearray(rng.choice(OPENJMS).read_bytes())
            for _ in range(rng.randint(0, 4)):  # 0 keeps a good one now and then
                at = rng.randrange(len(data))
                if rng.random() < 0.5:
                    data[at] ^= rng.randint(1, 255)
                else:
                    data[at:at + 4] = struct.pack(">i", 0x7FFFFFF0)
            openjms_message(conn, t, f"ID:fuzz-{i}", 1, bytes(data), [100])
    assert b.cli("init") == 0
    assert b.cli("sync", "--once") == 0
    ledger = b.ledger()
    assert sum(ledger.values()) == 60 and ledger["quarantined"] > 0
    with b.target.connect() as conn:
        reasons = conn.execute(sa.text("select reason from qbridge_quarantine")).scalars().all()
    assert all(reasons) and not [r for r in reasons if r.startswith("unexpected")], reasons
    assert b.cli("verify") == 0
    b.dispose()


def test_a_batch_of_mutated_biztalk_messages_ends_delivered_or_quarantined_with_reasons(tmp_path: Path) -> None:
    import random

    import sqlalchemy as sa

    from bridge.demo.run import BIZTALK_MAPPING
    from bridge.demo.samples import biztalk_message, biztalk_store

    def mutate(data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(rng.randint(0, 3)):
            at = rng.randrange(len(out))
            if rng.random() < 0.5:
                out[at] ^= rng.randint(1, 255)
            else:
                out[at:at + 4] = struct.pack("<I", 0x7FFFFFF0)
        return bytes(out)

    rng = random.Random(11)
    host = "BizTalkServerApplication"
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/msgbox.db", f"sqlite:///{tmp_path}/nsb.db", system="biztalk",
               queues=[host], mapping=BIZTALK_MAPPING)
    t = biztalk_store(b.source, [host])
    part = (FIXTURES / "biztalk" / "part_small_compressed.bin").read_bytes()
    with b.source.begin() as conn:
        for i in range(40):
            ctx = mutate(rng.choice(CONTEXTS).read_bytes())
            biztalk_message(conn, t, ctx, [("body", [mutate(part)], 2146)], host=host)
    assert b.cli("init") == 0
    assert b.cli("sync", "--once") == 0
    ledger = b.ledger()
    assert sum(ledger.values()) == 40 and ledger["quarantined"] > 0
    with b.target.connect() as conn:
        reasons = conn.execute(sa.text("select reason from qbridge_quarantine")).scalars().all()
    assert all(reasons) and not [r for r in reasons if r.startswith("unexpected")], reasons
    assert b.cli("verify") == 0
    b.dispose()
