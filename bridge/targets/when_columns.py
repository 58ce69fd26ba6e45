"""A `when` (bridge.mapping_rules) evaluated over a batch's lane rows at once, as Arrow kernels.

The columnar lane refines its groups by what each rule's `when` says of each row. The common
expressions are evaluated column-wise: comparisons, `&&`, `||`, `!`, `in` (a header's presence or
a list of strings), `startsWith`, `endsWith`, `contains` and `matches` over `system`, `queue`,
`destination`, `state`, `type` and header values. Anything else (a body field, `has`, `size`,
arithmetic, an escaped string) is not parsed here: `kernel` returns None, and the lane asks
the real CEL program row by row. So this is never a second CEL: what it takes it evaluates as
CEL does, errors included. A header a row lacks is an error value; `&&` and `||` absorb one when
the other side decides (false && error is false, true || error is true), `!` and the comparisons
pass it on, and an error never matches. Both use RE2 for `matches`, searching, not anchored.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_TOKEN = re.compile(r"""\s*(?:(?P<str>"[^"\\\n]*"|'[^'\\\n]*')|(?P<name>[A-Za-z_]\w*)|(?P<op>&&|\|\||==|!=|<=|>=|[<>!()\[\].,]))""")
_FACTS = ("system", "queue", "destination", "state", "type")
_METHODS = {"startsWith": pc.starts_with, "endsWith": pc.ends_with, "contains": pc.match_substring,
            "matches": pc.match_substring_regex}
_COMPARE = {"==": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}


class Unsupported(Exception):
    """The expression is beyond the kernels: the lane evaluates it row by row."""


@dataclass
class Truth:
    """A boolean per row and where it is an error value instead."""

    value: np.ndarray
    error: np.ndarray


@dataclass
class Rows:
    """What the kernels read of the lane rows: per row, its facts' texts, and a header's text or
    None (absent) through `header(name)`."""

    facts: dict[str, pa.Array]  # the five facts, a string per row
    header: Callable[[str], pa.Array]  # a header's value per row, null where the row lacks it
    n: int


def kernel(expression: str) -> Callable[[Rows], np.ndarray] | None:
    """The expression as a function of the rows giving where it matches, or None when it is
    beyond the kernels."""
    try:
        tokens = _tokens(expression)
        node, at = _or(tokens, 0)
        if at != len(tokens):
            raise Unsupported
    except Unsupported:
        return None

    def run(rows: Rows) -> np.ndarray:
        t = _truth(node(rows), rows.n)
        return t.value & ~t.error

    return run


def _tokens(expression: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(expression):
        if not expression[at:].strip():
            break
        m = _TOKEN.match(expression, at)
        if m is None:
            raise Unsupported
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        at = m.end()
    return out


Node = Callable[[Rows], Any]  # gives a Truth, a pa.Array of strings (null: error), a str or a list of str


def _chain(t: list[tuple[str, str]], at: int, op: str, operand: Callable[[list[tuple[str, str]], int], tuple[Node, int]],
           joined: Callable[[Node, Node], Node]) -> tuple[Node, int]:
    """`operand (op operand)*`, joined left to right."""
    left, at = operand(t, at)
    while at < len(t) and t[at] == ("op", op):
        right, at = operand(t, at + 1)
        left = joined(left, right)
    return left, at


def _or(t: list[tuple[str, str]], at: int) -> tuple[Node, int]:
    return _chain(t, at, "||", _and, _either)


def _and(t: list[tuple[str, str]], at: int) -> tuple[Node, int]:
    return _chain(t, at, "&&", _relation, _both)


def _relation(t: list[tuple[str, str]], at: int) -> tuple[Node, int]:
    left, at = _unary(t, at)
    if at < len(t) and (t[at][1] in _COMPARE and t[at][0] == "op" or t[at] == ("name", "in")):
        op = t[at][1]
        if op == "in":
            if t[at + 1: at + 2] == [("name", "headers")]:
                return _present(left), at + 2
            right, at = _unary(t, at + 1)
            return _member_of(left, right), at
        right, at = _unary(t, at + 1)
        left = _compared(op, left, right)
        if at < len(t) and (t[at][1] in _COMPARE or t[at][1] == "in"):
            raise Unsupported  # a == b == c: typed as CEL types it, not worth guessing
    return left, at


def _unary(t: list[tuple[str, str]], at: int) -> tuple[Node, int]:
    if at < len(t) and t[at] == ("op", "!"):
        inner, at = _unary(t, at + 1)
        return _not(inner), at
    return _member(t, at)


def _member(t: list[tuple[str, str]], at: int) -> tuple[Node, int]:
    node, at = _primary(t, at)
    while at < len(t) and t[at] == ("op", "."):
        if at + 3 >= len(t) or t[at + 1][0] != "name" or t[at + 2] != ("op", "("):
            raise Unsupported
        method = t[at + 1][1]
        if method not in _METHODS or t[at + 3][0] != "str" or t[at + 4: at + 5] != [("op", ")")]:
            raise Unsupported
        node = _method(method, node, t[at + 3][1][1:-1])
        at += 5
    return node, at


def _primary(t: list[tuple[str, str]], at: int) -> tuple[Node, int]:
    if at >= len(t):
        raise Unsupported
    kind, text = t[at]
    if kind == "str":
        return (lambda rows: text[1:-1]), at + 1
    if (kind, text) == ("op", "("):
        node, at = _or(t, at + 1)
        if t[at: at + 1] != [("op", ")")]:
            raise Unsupported
        return node, at + 1
    if (kind, text) == ("op", "["):
        items, at = [], at + 1
        while t[at: at + 1] and t[at][0] == "str":
            items.append(t[at][1][1:-1])
            at += 1
            if t[at: at + 1] == [("op", ",")]:
                at += 1
        if t[at: at + 1] != [("op", "]")]:
            raise Unsupported
        return (lambda rows: items), at + 1
    if kind == "name" and text in ("true", "false"):
        return (lambda rows: Truth(np.full(rows.n, text == "true"), np.zeros(rows.n, dtype=bool))), at + 1
    if kind == "name" and text in _FACTS and t[at + 1: at + 2] != [("op", "(")]:
        return (lambda rows: rows.facts[text]), at + 1
    if (kind, text) == ("name", "headers"):
        if t[at + 1: at + 2] == [("op", "[")] and t[at + 2: at + 3] and t[at + 2][0] == "str" and t[at + 3: at + 4] == [("op", "]")]:
            name = t[at + 2][1][1:-1]
            return (lambda rows: rows.header(name)), at + 4
        if t[at + 1: at + 2] == [("op", ".")] and t[at + 2: at + 3] and t[at + 2][0] == "name" and t[at + 3: at + 4] != [("op", "(")]:
            name = t[at + 2][1]  # headers.Region is headers["Region"] in CEL
            return (lambda rows: rows.header(name)), at + 3
    raise Unsupported


def _text(value: Any, rows: Rows) -> pa.Array:
    if isinstance(value, str):
        return pa.array([value] * rows.n, pa.string())
    if isinstance(value, pa.Array) and pa.types.is_string(value.type):
        return value
    raise Unsupported  # type-checked CEL would not get here; a kernel takes no chance


def _truth(value: Any, n: int) -> Truth:
    if isinstance(value, Truth):
        return value
    raise Unsupported


def _from_array(a: pa.Array) -> Truth:
    error = np.asarray(pc.is_null(a).to_numpy(zero_copy_only=False), dtype=bool)
    return Truth(np.asarray(pc.fill_null(a, False).to_numpy(zero_copy_only=False), dtype=bool) & ~error, error)


def _compared(op: str, left: Node, right: Node) -> Node:
    return lambda rows: _from_array(_COMPARE[op](_text(left(rows), rows), _text(right(rows), rows)))


def _method(name: str, target: Node, argument: str) -> Node:
    kernel_ = _METHODS[name]
    if name == "matches":
        try:
            kernel_(pa.array([""]), argument)
        except pa.ArrowInvalid:
            raise Unsupported from None  # a pattern RE2 refuses: CEL's error at run time, per row
    return lambda rows: _from_array(kernel_(_text(target(rows), rows), argument))


def _present(name: Node) -> Node:
    def run(rows: Rows) -> Truth:
        literal = name(rows)
        if not isinstance(literal, str):
            raise Unsupported
        return Truth(np.asarray(pc.is_valid(rows.header(literal)).to_numpy(zero_copy_only=False), dtype=bool),
                     np.zeros(rows.n, dtype=bool))
    return run


def _member_of(item: Node, items: Node) -> Node:
    def run(rows: Rows) -> Truth:
        values = items(rows)
        if not isinstance(values, list):
            raise Unsupported
        text = _text(item(rows), rows)
        return _from_array(pc.if_else(pc.is_null(text), pa.scalar(None, pa.bool_()),
                                      pc.is_in(text, value_set=pa.array(values, pa.string()))))
    return run


def _not(inner: Node) -> Node:
    def run(rows: Rows) -> Truth:
        t = _truth(inner(rows), rows.n)
        return Truth(~t.value & ~t.error, t.error)
    return run


def _both(left: Node, right: Node) -> Node:
    def run(rows: Rows) -> Truth:
        a, b = _truth(left(rows), rows.n), _truth(right(rows), rows.n)
        true = a.value & b.value & ~a.error & ~b.error
        false = (~a.value & ~a.error) | (~b.value & ~b.error)
        return Truth(true, ~true & ~false)
    return run


def _either(left: Node, right: Node) -> Node:
    def run(rows: Rows) -> Truth:
        a, b = _truth(left(rows), rows.n), _truth(right(rows), rows.n)
        true = (a.value & ~a.error) | (b.value & ~b.error)
        false = ~a.value & ~a.error & ~b.value & ~b.error
        return Truth(true, ~true & ~false)
    return run
