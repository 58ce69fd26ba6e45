"""The lane's Arrow kernels for `when` (bridge.targets.when_columns) say what CEL says: for random
expressions of the subset they take, over random rows (headers present, absent, values of every
kind), the kernel's match is CEL's own (cel-expr-python) row for row, errors included; what they
do not take they leave to CEL."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.mapping_rules import MessageFacts, When
from bridge.targets.when_columns import Rows, Unsupported, kernel

NAMES = ["A", "B", "Region", "type"]  # "type": a header named as the legacy type is (headers.type is the header)
TEXT = st.sampled_from(["", "a", "ab", "abc", "b", "eu", "EU", "x-1", "é", "m"])


def _atom() -> st.SearchStrategy[str]:
    name = st.sampled_from(NAMES)
    lit = TEXT.map(lambda t: f'"{t}"')
    value = st.one_of(name.map(lambda n: f'headers["{n}"]'), name.map(lambda n: f"headers.{n}"),
                      st.sampled_from(["type", "queue", "state", "system", "destination"]))
    return st.one_of(
        st.tuples(value, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), st.one_of(lit, value)).map(" ".join),
        st.tuples(lit, value, st.sampled_from(["==", "!="])).map(lambda t: f"{t[0]} {t[2]} {t[1]}"),
        name.map(lambda n: f'"{n}" in headers'),
        st.tuples(value, st.sampled_from(["startsWith", "endsWith", "contains", "matches"]), TEXT).map(
            lambda t: f'{t[0]}.{t[1]}("{t[2]}")'),
        st.tuples(value, st.lists(TEXT, max_size=3)).map(lambda t: f"{t[0]} in [{', '.join(repr(x).replace(chr(39), chr(34)) for x in t[1])}]"),
        st.sampled_from(["true", "false", 'headers["A"].matches("^a.$")', 'type.matches("b+")']),
    )


EXPRESSIONS = st.recursive(_atom(), lambda inner: st.one_of(
    st.tuples(inner, inner).map(lambda t: f"({t[0]} && {t[1]})"),
    st.tuples(inner, inner).map(lambda t: f"{t[0]} || {t[1]}"),
    inner.map(lambda e: f"!({e})")), max_leaves=6)

ROW = st.fixed_dictionaries({
    "headers": st.dictionaries(st.sampled_from(NAMES), TEXT, max_size=3),
    "type": TEXT, "queue": TEXT, "state": st.sampled_from(["ready", "failed"]), "system": TEXT, "destination": TEXT})


@settings(max_examples=400, deadline=None, derandomize=True)
@given(expression=EXPRESSIONS, rows=st.lists(ROW, min_size=1, max_size=12))
def test_the_kernels_match_where_cel_matches(expression: str, rows: list[dict]) -> None:
    when = When(expression)  # compiles and type-checks: the subset is CEL
    run = kernel(expression)
    assert run is not None, expression  # every expression drawn here is in the subset

    def header(name: str) -> pa.Array:
        return pa.array([r["headers"].get(name) for r in rows], pa.string())

    facts = {k: pa.array([r[k] for r in rows], pa.string()) for k in ("system", "queue", "destination", "state", "type")}
    got = run(Rows(facts, header, len(rows)))
    want = [when.evaluate(MessageFacts(r["system"], r["queue"], r["destination"], r["state"], r["type"], r["headers"], None))
            for r in rows]
    assert got.tolist() == want, expression
    assert got.dtype == np.bool_


def test_what_the_kernels_do_not_take_is_left_to_cel() -> None:
    for expression in ['has(body.N) && body.N > 0', 'size(headers) > 1', 'headers["A"] + "x" == "ax"',
                       'type(queue) == string', 'headers["A"] == "a\\"b"', '"A" in headers ? true : false',
                       "headers['A'].lowerAscii() == 'a'", 'headers["A"] == "a" == true', 'r"x" == queue']:
        assert kernel(expression) is None, expression
    # and one the parser takes whose operands are not strings is left to CEL when run
    run = kernel('headers["A"] == true')
    if run is not None:
        try:
            run(Rows({}, lambda n: pa.array(["a"]), 1))
        except Unsupported:
            pass
        else:
            raise AssertionError("a comparison of a header with a bool ran as a kernel")
