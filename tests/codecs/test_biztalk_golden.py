"""Every BizTalk golden vector decodes to exactly its manifest, through `qbridge inspect`."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from bridge.commands.main import main
from bridge.codecs.biztalk import BizTalkFormatError, CLSID_C4, decode_blocks, decode_context, decode_part, ole_date

HERE = Path(__file__).parents[1] / "fixtures" / "biztalk"
MANIFEST = json.loads((HERE / "manifest.json").read_text())
CONTEXTS = {k: v for k, v in MANIFEST["files"].items() if "properties" in v}
PARTS = {k: v for k, v in MANIFEST["files"].items() if "decoded_sha256" in v}


def inspect(capsys: pytest.CaptureFixture[str], kind: str, *files: Path) -> dict:
    assert main(["inspect", kind, *map(str, files), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_context_decodes_to_its_manifest(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    want = CONTEXTS[name]
    got = inspect(capsys, "biztalk-context", HERE / name)
    assert got["layout"] == ("C4" if want["layout"].startswith("C4") else "D4")
    keys = ("name", "namespace", "vt", "context_property_type", "is_array", "value")
    assert got["properties"] == [{k: p[k] for k in keys} for p in want["properties"]]


@pytest.mark.parametrize("name", sorted(PARTS))
def test_part_decodes_to_its_manifest(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    got = inspect(capsys, "biztalk-part", HERE / name)
    assert got == {"decoded_length": PARTS[name]["decoded_length"], "decoded_sha256": PARTS[name]["decoded_sha256"]}


def test_fragments_in_order_make_the_whole_part(capsys: pytest.CaptureFixture[str]) -> None:
    frag = MANIFEST["fragmented_message"]
    got = inspect(capsys, "biztalk-part", *(HERE / f for f in frag["files_in_order"]))
    assert got == {"decoded_length": frag["decoded_length"], "decoded_sha256": frag["decoded_sha256"]}


def _value(vt: int, payload: bytes) -> bytes:
    name = "P".encode("utf-16-le") + b"\0\0"
    ns = "urn:x".encode("utf-16-le") + b"\0\0"
    return (CLSID_C4 + struct.pack("<i", 1) + struct.pack("<i", len(ns)) + ns + struct.pack("<i", 1)
            + struct.pack("<i", len(name)) + name + struct.pack("<i", 2) + bytes([0]) + struct.pack("<H", vt) + payload)


@pytest.mark.parametrize("vt, payload, value", [
    (20, struct.pack("<q", -(2**62)), -(2**62)),  # VT_I8, never seen in fixtures
    (21, struct.pack("<Q", 2**63), 2**63),  # VT_UI8
    (6, struct.pack("<q", 123456), "12.3456"),  # VT_CY
    (0, b"", None), (1, b"", None),  # VT_EMPTY, VT_NULL
    (16, b"\x80", -128),  # VT_I1
    (7, struct.pack("<d", -1.25), "1899-12-29T06:00:00.000"),  # OLE date before the epoch
])
def test_documented_types_beyond_the_fixtures(vt: int, payload: bytes, value: object) -> None:
    layout, [prop] = decode_context(_value(vt, payload))
    assert layout == "C4" and prop.value == value and prop.vt == vt


def test_arrays_of_non_strings() -> None:
    payload = struct.pack("<H", 1) + struct.pack("<ii", 3, 0) + struct.pack("<iii", 1, 2, 3)
    blob = _value(3, b"")[:-3] + bytes([1]) + struct.pack("<H", 0x2003) + payload
    _, [prop] = decode_context(blob)
    assert prop.is_array and prop.value == [1, 2, 3]


@pytest.mark.parametrize("blob, why", [
    (b"\x00" * 16, "CLSID"),
    (_value(99, b"\x00\x00\x00\x00"), "unknown property type"),
    (_value(8, struct.pack("<i", 2_000_000_000)), "string length"),
    (CLSID_C4 + struct.pack("<i", 2_000_000_000), "count"),
])
def test_corrupt_contexts(blob: bytes, why: str) -> None:
    with pytest.raises(BizTalkFormatError, match=why):
        decode_context(blob)


def test_corrupt_and_hostile_blocks() -> None:
    good = (HERE / "part_small_compressed.bin").read_bytes()
    with pytest.raises(BizTalkFormatError, match="truncated"):
        decode_blocks(good[:-12])  # no end-of-stream block
    bad = bytearray(good)
    bad[20] ^= 0xFF
    with pytest.raises(BizTalkFormatError):
        decode_blocks(bytes(bad))
    bomb = zlib.compress(b"\0" * 10_000_000)
    with pytest.raises(BizTalkFormatError, match="inflates past"):
        decode_blocks(struct.pack("<iii", 1, 100, len(bomb)) + bomb + bytes(12))
    with pytest.raises(BizTalkFormatError, match="bad block header"):
        decode_blocks(struct.pack("<iii", 1, 2_000_000_000, 10) + bytes(22))


def test_raw_unframed_part_is_accepted_when_its_length_is_the_part_size() -> None:
    assert decode_part([b"<x/>"], part_size=4) == b"<x/>"
    with pytest.raises(BizTalkFormatError, match="nPartSize"):
        decode_part([(HERE / "part_small_uncompressed.bin").read_bytes()], part_size=5)


def test_ole_dates() -> None:
    assert ole_date(36311.76388888889) == "1999-05-31T18:20:00.000"
    assert ole_date(0.0) == "1899-12-30T00:00:00.000"
