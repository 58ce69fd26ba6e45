"""A BizTalk context property whose BSTR holds a lone UTF-16 surrogate (a value .NET lets a
pipeline promote, which no UTF-8 database stores) quarantines its message with the header named,
as a value alone or inside an array; the messages beside it are delivered."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.sources.biztalk import BizTalkSource
from tests.systems.test_biztalk_source import SMALL, fx, make_bt

BTS = "http://schemas.microsoft.com/BizTalk/2003/system-properties"


def _bstr(text: str) -> bytes:
    raw = text.encode("utf-16-le", "surrogatepass") + b"\0\0"
    return struct.pack("<i", len(raw)) + raw


def _bag(array: bool) -> bytes:
    """A C4 bag: BTS.MessageType, and BTS.Odd promoted, holding "a\\ud800" (alone, or as an array's one item)."""
    out = bytes.fromhex("C4E0906C1849D311A24200C04F60A533") + struct.pack("<i", 1) + _bstr(BTS) + struct.pack("<i", 2)
    out += _bstr("MessageType") + struct.pack("<i", 2) + struct.pack("<BH", 0, 8) + _bstr("http://x#Order")
    value = struct.pack("<BH", 1, 8 | 0x2000) + struct.pack("<Hii", 1, 1, 0) if array else struct.pack("<BH", 0, 8)
    return out + _bstr("Odd") + struct.pack("<i", 2) + value + _bstr("a\ud800")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_lone_surrogate_quarantines_its_message_naming_the_header(tmp_path: Path, request: Any, kind: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BizTalkSource, "lane_min_rows", 64)  # its own threshold is more than these 72 rows
    for bt in make_bt(kind, request, tmp_path):
        odd = [bt.publish(context=_bag(array), parts=[SMALL]) for array in (False, True)]
        for _ in range(70):  # enough for the columnar lane to take the batch
            bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        assert bt.cli("sync", "--once") == 0
        assert bt.count("Orders") == 70
        with bt.target.connect() as conn:
            prefix = f'"{bt.target_schema}".' if bt.target_schema else ""
            reasons = dict(conn.execute(sa.text(f"select source_key, reason from {prefix}qbridge_quarantine")).all())
        assert set(reasons) == {f"Q:{m}:{i}" for m, i in odd}, reasons
        for reason in reasons.values():
            assert "headers['BTS.Odd'] holds a lone UTF-16 surrogate" in reason, reason
