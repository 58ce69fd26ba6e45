"""A batch whose bodies pass Arrow's 2 GiB a column comes from pyarrow as a ChunkedArray (pa.array
of binary values splits there), which the write's concat of a lane's groups does not take (a
session 9 review asked whether such a batch stalls its queue). It does not: the write's failure
sends the batch to the per-row lanes, which deliver every message once. The ChunkedArray here is
pyarrow's own, of small chunks, standing for one of 2 GiB that a test cannot allocate in time
(2.2 GB of bodies took 26 s to make on this machine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bridge.sources.biztalk import BizTalkSource
from tests.systems.test_biztalk_source import SMALL, fx, make_bt


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_batch_whose_bodies_come_chunked_is_written_by_the_per_row_lanes(tmp_path: Path, request: Any, kind: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    made = BizTalkSource.plain_columns
    chunked: list[int] = []

    def in_chunks(self: Any, *args: Any, **kw: Any) -> Any:
        cols = made(self, *args, **kw)
        if cols is None:
            return None
        bodies = cols.bodies
        chunked.append(len(bodies))
        return dataclasses.replace(cols, bodies=pa.chunked_array([bodies.slice(0, 1), bodies.slice(1)]))

    monkeypatch.setattr(BizTalkSource, "plain_columns", in_chunks)
    monkeypatch.setattr(BizTalkSource, "lane_min_rows", 64)  # its own threshold is more than 70 rows
    for bt in make_bt(kind, request, tmp_path):
        for i in range(70):  # enough for the lane; two contexts: two groups
            bt.publish(context=fx("ctx_receive.bin" if i % 2 else "real_ctx_1.bin"), parts=[SMALL])
        assert bt.cli("sync", "--once") == 0
        assert chunked, "the lane was not asked"
        tables = ("Orders", "Sap", "Unrouted", "error")
        assert sum(bt.count(t) for t in tables) == 70
        assert len(bt.message_ids(*tables)) == 70
