"""OpenJMS property values as header text (bridge.sources.openjms_values.property_text): a Float
is spelled as the shortest text that reads back to the same float32, as Java prints it, and
every float32 has one, the largest included (a text past it used to raise OverflowError out of
the row's decode, and the batch failed again at every pass)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.sources.openjms_values import property_text

MAX = struct.unpack(">f", bytes.fromhex("7f7fffff"))[0]  # Float.MAX_VALUE


def text(value: float) -> str:
    return property_text({"type": "java.lang.Float", "value": value})


def test_the_largest_floats_are_spelled_as_java_does() -> None:
    assert text(MAX) == "3.4028235e+38"  # Java: 3.4028235E38
    assert text(-MAX) == "-3.4028235e+38"
    assert text(1.5) == "1.5" and text(-0.0) == "-0" and text(0.0) == "0"


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.floats(width=32, allow_nan=False))
def test_every_float32_is_spelled_as_text_that_reads_back_to_it(value: float) -> None:
    spelled = text(value)
    assert struct.pack(">f", float(spelled)) == struct.pack(">f", value)
    assert text(value) == spelled  # the second time from the cache: the same text
