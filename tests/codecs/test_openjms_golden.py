"""Every OpenJMS golden vector decodes to exactly its manifest, through `qbridge inspect`."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from bridge.commands.main import main
from bridge.codecs.openjms_blob import BlobError, decode

HERE = Path(__file__).parents[1] / "fixtures" / "openjms"
MANIFEST = json.loads((HERE / "manifest.json").read_text())["fixtures"]


def inspect(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["inspect", "openjms-message", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case", MANIFEST, ids=[c["file"] for c in MANIFEST])
def test_fixture_decodes_to_its_manifest(case: dict, capsys: pytest.CaptureFixture[str]) -> None:
    got = inspect(HERE / case["file"], capsys)
    assert got["java_class"] == case["java_class"]
    assert got["message_type"] == case["message_type"]
    expected_headers = {k: v for k, v in case["headers"].items() if not k.endswith("_encoding")}
    assert got["headers"] == expected_headers
    assert got["properties"] == case["properties"]
    for key in ("readOnly", "processed", "acceptedTime", "sequenceNumber", "wildcard"):
        assert got["internal"][key] == case["internal"][key], key
    body, want = got["body"], case["body"]
    if "map" in want:
        assert body == {"map": want["map"]}
    elif "values" in want:
        assert body == {"values": want["values"]}
        assert base64.b64decode(want["raw_base64"])  # the raw form is OpenJMS's typed encoding
    elif "bytes_base64" in want:
        assert body == {"base64": want["bytes_base64"]} and len(base64.b64decode(body["base64"])) == want["length"]
    elif "payload_base64" in want:
        assert body == {"base64": want["payload_base64"]} and len(base64.b64decode(body["base64"])) == want["payload_length"]
    elif want == {}:
        assert body == {}
    else:
        text = body["text"]
        if "text" in want:
            assert text == want["text"]
        if text is not None:
            assert len(text.encode("utf-16-le")) // 2 == want["text_length_utf16"]
            assert hashlib.sha256(text.encode("utf-8")).hexdigest() == want["text_sha256_utf8"]
        if "text_head" in want:
            assert text.startswith(want["text_head"]) and text.endswith(want["text_tail"])
            assert len(text) == want["text_length_codepoints"]


def test_truncated_blob_names_the_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blob = (HERE / "text_simple.bin").read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(blob[: len(blob) // 2])
    assert main(["inspect", "openjms-message", str(cut), "--json"]) == 1
    assert "truncated" in capsys.readouterr().err


@pytest.mark.parametrize("mutate, why", [
    (lambda b: b.replace(b"org.exolab.jms.message.TextMessageImpl", b"org.exolab.jms.message.TextMessageImpX"), "unknown class"),
    (lambda b: b"\x00" + b[1:], "magic"),
    (lambda b: b[:4] + b"\x73\x71\x00\x7f\xff\xff", "back-reference"),
])
def test_corrupt_blobs_raise_blob_error(mutate, why: str) -> None:
    with pytest.raises(BlobError, match=why):
        decode(mutate((HERE / "text_simple.bin").read_bytes()))
