"""The compiled root `$type` scanner (bridge/codecs/bodytype_native.pyx) against orjson, which the
NGinn lane asked for every body before (issue 49): where the scanner answers, orjson gives the
same answer; where it is not sure it defers, and the lane asks orjson. It must answer the common
body (a message's JSON with nested objects and arrays) and the golden NGinn rows' bodies."""

from __future__ import annotations

import json
import string
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.codecs.bodytype_native import DEFER, root_types
from bridge.sources import nginn_lane

BODY = ('{"$type":"Shop.Messages.OrderPlaced, Shop.Messages","OrderId":12345,"Customer":"customer-376","Lines":['
        + '{"Sku":"SKU-000123","Qty":2,"Price":19.99},' * 9 + '{"Sku":"SKU-000999","Qty":1,"Price":5.00}],"Note":"xx"}')


def reference(text: Any) -> Any:
    """What nginn_lane._body_types made of one body with orjson."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict:
        return None
    value = doc.get("$type")
    return "" if value is None else value if type(value) is str else None


def answered(text: Any) -> Any:
    """The scanner's answer, held to orjson's where it gives one."""
    [got], deferred = root_types([text], [True])
    if got is DEFER:
        assert deferred == [0]
    else:
        assert deferred == []
        want = reference(text)
        assert got == want and type(got) is type(want), (text, got, want)
    return got


def test_the_scanner_is_built_and_used() -> None:
    assert nginn_lane.ROOT_TYPES is root_types, "bridge.codecs.bodytype_native was not built: pip install -e . with gcc"


def test_common_bodies_are_answered() -> None:
    for text, want in ((BODY, "Shop.Messages.OrderPlaced, Shop.Messages"), ("{}", ""), (' { "a" : [ 1 , -2.5 , true ] } ', ""),
                       ('{"$type":null}', ""), ('{"$type":7}', None), ('{"$type":"A","$type":"B"}', "B"),
                       ('{"$type":"A","$type":null}', ""), ('{"$type":"Zoë 東京"}', "Zoë 東京"),
                       ('{"a":"\\u00e9\\n","$type":"T"}', "T")):
        assert answered(text) == want, text


def test_rows_that_are_not_ok_are_none_and_not_read() -> None:
    assert root_types([BODY, "{not json", None], [False, False, False]) == ([None, None, None], [])


def test_doubtful_bodies_are_deferred() -> None:
    for text in ("[1]", '"x"', "{", '{"a":1e5}', '{"a":1234567890123456}', '{"a":"\\ud800"}', '{"\\u0024type":"X"}',
                 '{"$type":"A\\nB"}', "{}x", '{"a":01}', '{"a":[' * 70 + "]" * 70 + "}", "{\"a\":\"\x01\"}", "{\"a\":\"\ud800\"}",
                 '{"a":NaN}', '{"a":tru}', "", "  "):
        assert answered(text) is DEFER, text
    [got], _ = root_types([b'{"$type":"X"}'], [True])  # not a str: orjson decides
    assert got is DEFER


_key = st.one_of(st.sampled_from(["$type", "a", "Lines", "$typ", "$types"]), st.text(max_size=6))
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**17, 10**17), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12))
_json = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_key, inner, max_size=4)),
                     max_leaves=20)


@st.composite
def _bodies(draw: st.DrawFn) -> str:
    """JSON objects as .NET and Python writers spell them: compact or spaced, escaped or not, with
    `$type` first, later, repeated or absent."""
    members = draw(st.lists(st.tuples(_key, _json), max_size=6))
    sep = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
    ascii_only = draw(st.booleans())
    parts = [json.dumps(k, ensure_ascii=ascii_only) + sep[1] + json.dumps(v, ensure_ascii=ascii_only, separators=sep)
             for k, v in members]
    return draw(st.sampled_from(["{", " {", "\n{ "])) + sep[0].join(parts) + draw(st.sampled_from(["}", " }", "}\r\n"]))


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies())
def test_written_bodies_read_as_orjson_reads_them(text: str) -> None:
    answered(text)


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    text = list(draw(st.one_of(_bodies(), st.just(BODY))))
    for _ in range(draw(st.integers(1, 3))):
        if not text:
            break
        at = draw(st.integers(0, len(text) - 1))
        text[at] = draw(st.sampled_from([*'{}[]",:\\ -.0e+', "\x00", "\x1f", "\ud800", *string.ascii_letters[:6]]))
    cut = draw(st.integers(0, len(text)))
    return "".join(text[:cut] if draw(st.booleans()) else text)


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_and_cut_bodies_read_as_orjson_reads_them_or_defer(text: str) -> None:
    answered(text)


def test_the_lane_gives_orjsons_answers_with_the_scanner_and_without(monkeypatch: Any) -> None:
    texts = [BODY, "{not json", '{"$type":7}', '{"a":1e5,"$type":"E"}', None, '{"$type":"T"}']
    ok = [True, True, True, True, False, True]
    fast = nginn_lane._body_types(texts, ok, False)
    monkeypatch.setattr(nginn_lane, "ROOT_TYPES", None)
    assert fast == nginn_lane._body_types(texts, ok, False) == ([reference(BODY), None, None, "E", None, "T"], None)
