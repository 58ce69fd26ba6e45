"""Session 9 review (issue 49): with a BizTalk fetch's uuid columns as the server's text on
PostgreSQL (the driver's UUIDs elsewhere), the fetch's row and a give-back's re-read of the same
entry agree, as raw JSON and as decoded messages, for a ready and a suspended message with a
fragmented part shared with another message and a body part that is not first by name."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bridge.sources import biztalk_giveback
from bridge.sources.base import SourceRow
from tests.systems.test_biztalk_source import FRAGMENTED, SMALL, fx, make_bt

QUEUE = "BizTalkServerApplication"


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
@pytest.mark.parametrize("suspended", [None, {"nState": 4, "nvcErrorDescription": "boom", "info": "x"}])
def test_fetch_and_giveback_reread_agree(tmp_path: Path, request: Any, kind: str, suspended: Any) -> None:
    for b in make_bt(kind, request, tmp_path):
        m, i = b.publish(context=fx("ctx_receive.bin"), parts=[("zbody", *FRAGMENTED[1:]), ("attach", *SMALL[1:])],
                         suspended=suspended)
        t = b.bt
        # the body is "zbody" (Spool.uidBodyPartID) though "attach" sorts first
        with b.source.begin() as conn:
            body = conn.execute(sa.select(t["Spool"].c.uidBodyPartID).where(t["Spool"].c.uidMessageID == m)).scalar_one()
            # a second message sharing the body part
            m2, i2 = uuid.uuid4(), uuid.uuid4()
            conn.execute(t["Spool"].insert().values(uidMessageID=m2, dtTimeStamp=None, nNumParts=1, uidBodyPartID=body,
                                                    nvcBodyPartName="zbody", nCounter=1, imgContext=fx("ctx_receive.bin")))
            conn.execute(t["MessageParts"].insert().values(uidMessageID=m2, uidPartID=body, nvcPartName="zbody", nBodyPart=1))
            conn.execute(t[f"{QUEUE}Q"].insert().values(uidMessageID=m2, uidInstanceID=i2))
        runner = b.runner()
        source = runner.sources[QUEUE]
        prefix = "S" if suspended else "Q"
        key = f"{prefix}:{m}:{i}"
        with runner.source_engine.connect() as conn:
            [row, row2] = source.fetch_keys(conn, [key, f"Q:{m2}:{i2}"], False)
            again = biztalk_giveback.message_values(source, conn, key, None, suspended and "x")
        fetched_raw, reread_raw = source.raw(row), source.raw(SourceRow(key=key, consumable=True, values=again))
        fetched_raw["uidServiceID"] = reread_raw["uidServiceID"] = None
        assert fetched_raw == reread_raw
        a = source.decode(row)
        c = source.decode(source.from_raw(reread_raw, key))
        assert a.body == c.body and [p.name for p in a.parts] == [p.name for p in c.parts] == ["attach"]
        assert a.headers["BizTalk.BodyPartName"] == "zbody"
        d = source.decode(SourceRow(key=key, consumable=True, values=again))
        assert d.body == a.body and d.headers == a.headers
        assert source.decode(row2).body == a.body
