"""Session 9 review of bridge/codecs/bodytype_native.pyx (1ee46ef): no divergence from the orjson
reference was found; these are the edge cases probed, kept as a regression guard (all pass)."""

from __future__ import annotations

import pytest

from bridge.codecs.bodytype_native import DEFER, root_types
from tests.codecs.test_bodytype_native import reference

VALUES = ["-", "-0", "0.", ".5", "1.", "00", "-01", "1.5e", "1.5E3", "-0.0", "123456789012345", "1234567890123456",
          "0.00000000000001", "0.000000000000001", "true", "false", "null", "nul", "tru", "truefalse", '"\x7f"',
          '"\U0001F600"', '"\uffff"', '"\\u0000"', '"\\uFFFE"', '"\\u00"', '"\\u"', '"\\', '"\x00"', '"\u2028"', '"\ud800"',
          '"\\ud800"', '"\\uDC00"', '"\\u12G4"', "[]", "{}", "[1,]", '{"$type":"x"}', '{"a\\"b":{"$type":1}}', '{"\\u0000":1}']
TEMPLATES = ['{"a":%s}', '{"$type":%s}', '{"a":[%s]}', '{"$type":"T","a":%s}', '{"a":{"b":%s}}', '{"a":%s', '{"$type":%s']
SPACES = ["\x0b", "\x0c", "\xa0", "\u2028", "\ufeff", "\x00", "\x85", " ", "\t", "\n", "\r"]
SPACE_TEMPLATES = ["%s{}", "{}%s", "{%s}", '{"a":%s1}', '{"a"%s:1}', '{"a":[1%s,2]}', '%s{"$type":"x"}']
OTHERS = ['{"$type":"A","$type":7}', '{"$type":7,"$type":"A"}', '{"$type":null,"$type":"A"}', '{"$type":"A","$type":null}',
          '{"$type":{"$type":"X"}}', '{"a":{"$type":"X"}}', '{"$type":[]}', '{"$type":true}', '{"\\u0024type":"X"}',
          '{"a":{"k\\u0041":1,"$type":"z"}}', '{"a":' + "[" * 63 + "]" * 63 + "}", '{"a":' + "[" * 64 + "]" * 64 + "}",
          '{"a":' + "[" * 1100 + "]" * 1100 + "}", "{}{}", '{"a":1}}', "\ud800", ""]
CASES = [t % v for t in TEMPLATES for v in VALUES] + [t % s for t in SPACE_TEMPLATES for s in SPACES] + OTHERS


@pytest.mark.parametrize("text", CASES)
def test_answer_equals_orjson_or_defers(text: str) -> None:
    [got], deferred = root_types([text], [True])
    if got is DEFER:
        assert deferred == [0]
        return
    want = reference(text)
    assert got == want and type(got) is type(want), (text, got, want)
