"""The compiled reader of Parts/Fragments block streams (biztalk_native.decode_blocks) against the
pure-Python one it stands in for (biztalk.decode_blocks_python): on every golden part and fragment,
on streams hypothesis writes (stored and zlib blocks, bytes after a zlib stream's end, sizes that
lie) and on mutations of both, it gives the very same bytes, or None exactly where the Python
reader refuses; `decode_blocks` then raises the Python reader's error."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs import biztalk
from bridge.codecs.biztalk import BizTalkFormatError, decode_blocks, decode_blocks_python

HERE = Path(__file__).parents[1] / "fixtures" / "biztalk"
STREAMS = sorted([*HERE.glob("part_*.bin"), *HERE.glob("frag_*.bin"), *HERE.glob("real_dtaspy_part_*.bin")])


def test_the_compiled_block_reader_is_built_and_used() -> None:
    assert biztalk.COMPILED_BLOCKS is not None, "bridge.codecs.biztalk_native was not built: pip install -e . with gcc and zlib1g-dev"


def same_or_declined(blob: bytes) -> bytes | None:
    assert biztalk.COMPILED_BLOCKS is not None
    fast = biztalk.COMPILED_BLOCKS(blob)
    try:
        slow = decode_blocks_python(blob)
    except BizTalkFormatError as e:
        assert fast is None, "the compiled reader read a stream the Python reader refuses"
        with pytest.raises(BizTalkFormatError) as refused:
            decode_blocks(blob)
        assert str(refused.value) == str(e)
        return None
    assert fast is not None, "the compiled reader declined a stream the Python reader reads"
    assert type(fast) is bytes and fast == slow
    return fast


@pytest.mark.parametrize("path", STREAMS, ids=[p.name for p in STREAMS])
def test_every_golden_part_and_fragment_reads_alike(path: Path) -> None:
    blob = path.read_bytes()
    got = same_or_declined(blob)
    assert got is not None or not blob.startswith(b"\0\0\0\0\0\0\0\0\0\0\0\0")


def test_the_golden_parts_are_read_by_the_compiled_reader() -> None:
    """Not every vector is declined and left to the Python reader: the compiled one reads them."""
    read = [p.name for p in STREAMS if biztalk.COMPILED_BLOCKS(p.read_bytes()) is not None]  # type: ignore[misc]
    assert "part_small_compressed.bin" in read and "frag_0.bin" in read and len(read) >= len(STREAMS) - 2, read


@st.composite
def _block(draw: st.DrawFn) -> bytes:
    data = draw(st.one_of(st.binary(min_size=1, max_size=300), st.binary(min_size=1, max_size=8).map(lambda b: b * 200)))
    kind = draw(st.sampled_from(["stored", "zlib", "zlib+tail", "lying size"]))
    if kind == "stored":
        return struct.pack("<iii", 0, len(data), len(data)) + data
    packed = zlib.compress(data, draw(st.integers(0, 9)))
    if kind == "zlib+tail":  # bytes after the stream's end, inside the block: unused_data to both readers
        packed += draw(st.binary(min_size=1, max_size=5))
    size = len(data) + (draw(st.sampled_from([-1, 1])) if kind == "lying size" and len(data) > 1 else 0)
    return struct.pack("<iii", 1, size, len(packed)) + packed


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    return b"".join(draw(st.lists(_block(), max_size=4))) + struct.pack("<iii", 0, 0, 0)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_streams_of_stored_and_compressed_blocks_read_alike(blob: bytes) -> None:
    same_or_declined(blob)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.one_of(streams(), st.sampled_from(STREAMS).map(Path.read_bytes))))
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
    cut = draw(st.integers(0, len(data)))
    extra = draw(st.sampled_from([b"", b"\0", b"\0" * 12]))
    return bytes(data[:cut] if draw(st.booleans()) else data) + extra


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_and_cut_streams_read_alike_or_decline(blob: bytes) -> None:
    same_or_declined(blob)


def test_a_block_that_inflates_past_its_size_is_refused_without_inflating_it_whole() -> None:
    """A hostile block (a megabyte of zeros stated as 10 bytes) is refused by both readers."""
    packed = zlib.compress(b"\0" * (1 << 20))
    blob = struct.pack("<iii", 1, 10, len(packed)) + packed + struct.pack("<iii", 0, 0, 0)
    assert same_or_declined(blob) is None


def test_blocks_that_claim_more_than_they_hold_are_refused_without_allocating_their_claim() -> None:
    """Headers alone can claim a megabyte a 13-byte block: the compiled reader leaves a fragment
    claiming more than 16 MiB to the Python reader (no MemoryError, no transient gigabyte), which
    refuses it at its first block; a real part of 20 MiB still reads, by the Python reader."""
    bogus = struct.pack("<iii", 1, 1 << 20, 1) + b"x"
    blob = bogus * 200_000 + struct.pack("<iii", 0, 0, 0)
    assert biztalk.COMPILED_BLOCKS is not None and biztalk.COMPILED_BLOCKS(blob) is None
    with pytest.raises(BizTalkFormatError, match="inflates past its stated 1048576 bytes"):
        decode_blocks(blob)
    data = bytes(range(256)) * 4096  # 1 MiB a block
    block = zlib.compress(data)
    big = (struct.pack("<iii", 1, len(data), len(block)) + block) * 20 + struct.pack("<iii", 0, 0, 0)
    assert decode_blocks(big) == data * 20
