"""Mapping rules (issue 47) on the columnar lane: a group's example decides for its rows only where
they agree on everything the rules read, so the lane splits its groups first.

- Each `when` is evaluated over the lane rows: once per group where it reads only what a group
  shares (bridge.mapping_rules.When.per_group), as Arrow kernels where it reads header values
  (bridge.targets.when_columns), else by the real CEL program row by row.
- The groups are split by those outcomes. While a group's example runs through the target's real
  `plain_envelope`, every `when` gives its group's outcome (mapping_rules.FORCED), so the example
  takes the same rules as each of its rows would.
- Body operations run per row with orjson, through the same code as the per-row lanes
  (reshape.body_of_row); so do the body fields a header rule copies. A row whose body a rule
  cannot take is given back to the per-row lanes, which quarantine it with the rule's reason.
  The groups are split again by which copied fields each row has, and the example writes a
  marker where the row's own text goes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bridge.errors import BadRow
from bridge.mapping import Mapping
from bridge.mapping_rules import MessageFacts, When, compiled
from bridge.model import PlainMessage
from bridge.sources.columns import PlainColumns, np_bool
from bridge.targets.reshape import body_of_row
from bridge.targets.when_columns import Rows, Unsupported, kernel

_MARKER = re.compile("\x00(\\w+)\x00")
_ODD = r"[\x00-\x08\x0b\x0c\x0e-\x1f]"  # what the lane's escaping cannot write (orjson reads no lone surrogate)


@dataclass
class RuledGroups:
    """The lane rows' groups split by the rules: per row its group (-1: given back to the per-row
    lanes), and per group its example with what the rules hold for it."""

    groups: np.ndarray
    examples: list[tuple[PlainMessage, dict[int, bool], dict[tuple[int, int], bool]]] = field(default_factory=list)
    bodies: pa.Array | None = None  # the rows' bodies as the body rules leave them (None: as read)
    values: dict[str, pa.Array] = field(default_factory=dict)  # B<i>_<j>: header rule i's j-th from_body, per row


def whens(mapping: Mapping) -> list[When]:
    """Every distinct `when` of the rules, in file order."""
    found: dict[int, When] = {}
    for rule in (*mapping.skip, *mapping.route_rules, *mapping.body, *mapping.header_rules, *mapping.ttbr):
        when = compiled(rule)
        if when is not None:
            found.setdefault(id(when), when)
    return list(found.values())


def refine(cols: PlainColumns, mapping: Mapping) -> RuledGroups:
    """`cols`' groups split by what the mapping's rules hold for each row."""
    n = len(cols.groups)
    base = cols.groups
    examples = cols.examples
    facts = [_facts(ex) if ex is not None else None for ex in examples]
    lost = np.zeros(n, dtype=bool)  # rows given back
    for g, f in enumerate(facts):
        if f is None or any("\x00" in v for v in f.values()):
            lost |= base == g
    headers = _Headers(cols)
    rows = Rows({k: pa.array([f[k] if f else "" for f in facts], pa.string()).take(pa.array(base)) for k in
                 ("system", "queue", "destination", "state", "type")}, headers.column, n)
    listed = whens(mapping)
    outcome = np.zeros((n, len(listed)), dtype=bool)
    for w, when in enumerate(listed):
        if when.per_group:
            said = np.array([bool(ex is not None and f is not None and when.evaluate(_message_facts(ex, f)))
                             for ex, f in zip(examples, facts)], dtype=bool)
            outcome[:, w] = said[base] if len(said) else False
            continue
        run = when.__dict__.get("_kernel", False)
        if run is False:
            run = when.__dict__.setdefault("_kernel", kernel(when.expression))
        try:
            if run is None:
                raise Unsupported
            outcome[:, w] = run(rows)
        except Unsupported:
            outcome[:, w] = _per_row(when, cols, examples, facts, headers, lost)
    lost |= headers.unknown
    first = _split(base, outcome, lost)
    bodies: list[Any] | None = None
    present = np.zeros((n, sum(len(r.from_body) for r in mapping.header_rules)), dtype=bool)
    values: dict[str, list[str]] = {}
    forced_of: dict[int, dict[int, bool]] = {}
    items: dict[int, list[tuple[int, int]]] = {}
    order = np.argsort(first, kind="stable")
    for members in np.split(order, np.flatnonzero(np.diff(first[order])) + 1):
        g1 = int(first[members[0]]) if len(members) else -1
        if g1 < 0:
            continue
        at = int(members[0])
        forced = forced_of[g1] = {id(when): bool(outcome[at, w]) for w, when in enumerate(listed)}
        body_rules, from_body, slots = _holding(mapping, forced)
        items[g1] = slots
        if body_rules is None:
            lost[members] = True
            continue
        if not body_rules and not from_body:
            continue
        if bodies is None:
            bodies = cols.bodies.to_pylist()
        for i, j in slots:
            values.setdefault(f"B{i}_{j}", [""] * n)
        columns: list[tuple[list[str], list[int]]] = [(values[f"B{i}_{j}"], []) for i, j in slots]  # texts, rows with one
        docs = cols.docs
        for r in members.tolist():
            try:
                bodies[r], texts = body_of_row(body_rules, from_body, bodies[r], None if docs is None else docs[r])
            except BadRow:
                lost[r] = True
                continue
            for (column, rows_with), text in zip(columns, texts):
                if text is not None:
                    column[r] = text
                    rows_with.append(r)
        for (i, j), (_, rows_with) in zip(slots, columns):
            present[rows_with, _slot_index(mapping, i, j)] = True
    texts_of = {k: pa.array(v, pa.string()) for k, v in values.items()}
    for column in texts_of.values():  # a text the lane's escaping cannot write: the per-row lanes write it
        lost |= np_bool(pc.match_substring_regex(column, _ODD))
    final = _split(first, present, lost)
    done = RuledGroups(final, bodies=None if bodies is None else pa.array(bodies, pa.binary()), values=texts_of)
    for at in _firsts(final).values():
        g1 = int(first[at])
        has = {slot: bool(present[at, _slot_index(mapping, *slot)]) for slot in items[g1]}
        done.examples.append((examples[int(base[at])], forced_of[g1], has))
    return done


def _split(group: np.ndarray, bits: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """A group id per row by its group and its row of bits (-1 where lost)."""
    out = np.full(len(group), -1, dtype=np.int64)
    keep = np.flatnonzero(~lost)
    if len(keep):
        if bits.shape[1] <= 40:  # packed into one int64 beside the group: a 1-d unique, not a row-wise one
            code = group[keep].astype(np.int64) << bits.shape[1]
            if bits.shape[1]:
                code |= bits[keep].astype(np.int64) @ (np.int64(1) << np.arange(bits.shape[1], dtype=np.int64))
            _, inverse = np.unique(code, return_inverse=True)
        else:
            _, inverse = np.unique(np.column_stack([group[keep], bits[keep].astype(np.int64)]), axis=0, return_inverse=True)
        out[keep] = inverse.reshape(-1)
    return out


def _firsts(groups: np.ndarray) -> dict[int, int]:
    """Each group's first row."""
    ids, at = np.unique(groups, return_index=True)
    return {int(g): int(a) for g, a in zip(ids, at) if g >= 0}


def _slot_index(mapping: Mapping, i: int, j: int) -> int:
    return sum(len(r.from_body) for r in mapping.header_rules[:i]) + j


def _holding(mapping: Mapping, forced: dict[int, bool]) -> tuple[list[Any] | None, list[tuple[int, str, str]], list[tuple[int, int]]]:
    """The body rules that hold and touch a body, the (rule, header, path) of the from_body items
    of the header rules that hold, and their (rule, item) slots; None for the body rules when one
    converts XML (the per-row lanes do that)."""
    def holds(rule: Any) -> bool:
        when = compiled(rule)
        return when is None or forced[id(when)]

    body: list[Any] = []
    for i, rule in enumerate(mapping.body):
        if holds(rule) and rule.xml != "keep":
            if rule.xml == "json":
                return None, [], []
            body.append((i, rule))
    from_body, slots = [], []
    for i, hrule in enumerate(mapping.header_rules):
        if hrule.from_body and holds(hrule):
            for j, (name, path) in enumerate(hrule.from_body.items()):
                from_body.append((i, name, path))
                slots.append((i, j))
    return body, from_body, slots


def _facts(ex: PlainMessage) -> dict[str, str]:
    return {"system": ex.system, "queue": ex.queue, "destination": ex.destination, "state": ex.state,
            "type": ex.enclosed_types[0] if ex.enclosed_types else ""}


def _message_facts(ex: PlainMessage, f: dict[str, str], headers: dict[str, str] | None = None,
                   body: bytes | None = None) -> MessageFacts:
    return MessageFacts(f["system"], f["queue"], f["destination"], f["state"], f["type"],
                        ex.headers if headers is None else headers, ex.body if body is None else body)


class _Headers:
    """The legacy headers' values per lane row, by name: the example's value where it is real (a
    group shares it), the row's own where the example has a marker (L<k>: its k-th legacy
    header's value; another: that value column, as a header NGinn derives from a column)."""

    def __init__(self, cols: PlainColumns) -> None:
        self.cols = cols
        self.unknown = np.zeros(len(cols.groups), dtype=bool)  # rows of a group whose value is neither
        self._found: dict[str, pa.Array] = {}

    def spec(self, ex: PlainMessage | None, name: str) -> tuple[str, Any] | None:
        """How group example `ex` has header `name`: ("L", k), ("column", name), ("text", its
        real text), ("unknown", None); None: it has none."""
        value = None if ex is None else ex.headers.get(name)
        if value is None:
            return None
        m = _MARKER.fullmatch(value)
        if m is not None:
            marker = m.group(1)
            if marker[:1] == "L" and marker[1:].isdigit():
                return "L", int(marker[1:])
            return ("column", marker) if marker in self.cols.values else ("unknown", None)
        return ("unknown", None) if "\x00" in value else ("text", value)

    def column(self, name: str) -> pa.Array:
        found = self._found.get(name)
        if found is not None:
            return found
        cols, n = self.cols, len(self.cols.groups)
        specs = [(g, self.spec(ex, name)) for g, ex in enumerate(cols.examples)]
        # The pool: the legacy header values, then each value column a group's header is, then the
        # groups' real texts; each offset fixed once every part of the pool is known.
        pool: list[pa.Array] = [cols.header_values.cast(pa.string())]
        offsets: dict[str, int] = {}
        size = len(pool[0])
        for _, spec in specs:
            if spec is not None and spec[0] == "column" and spec[1] not in offsets:
                offsets[spec[1]] = size
                pool.append(cols.values[spec[1]].cast(pa.string()))
                size += n
        constants: list[str] = []
        index = np.full(n, -1, dtype=np.int64)
        for g, spec in specs:
            if spec is None:
                continue
            rows = cols.groups == g
            kind, what = spec
            if kind == "L":
                index[rows] = cols.header_starts[rows] + what
            elif kind == "column":
                index[rows] = offsets[what] + np.flatnonzero(rows)
            elif kind == "text":
                index[rows] = size + len(constants)
                constants.append(what)
            else:
                self.unknown |= rows
        values = pa.concat_arrays([*pool, pa.array(constants, pa.string())])
        found = self._found[name] = values.take(pa.array(index, mask=index < 0))
        return found

    def of_row(self, ex: PlainMessage, r: int) -> dict[str, str] | None:
        out = {}
        for name in ex.headers:
            spec = self.spec(ex, name)
            assert spec is not None
            kind, what = spec
            if kind == "unknown":
                return None
            out[name] = (what if kind == "text" else self.cols.values[what][r].as_py() if kind == "column"
                         else self.cols.header_values[int(self.cols.header_starts[r]) + what].as_py())
        return out


def _per_row(when: When, cols: PlainColumns, examples: list[Any], facts: list[Any], headers: _Headers,
             lost: np.ndarray) -> np.ndarray:
    """The `when` by the real CEL program, row by row (what the kernels do not take)."""
    said = np.zeros(len(cols.groups), dtype=bool)
    for r, g in enumerate(cols.groups.tolist()):
        ex, f = examples[g], facts[g]
        row_headers = None if lost[r] or ex is None else headers.of_row(ex, r)
        if row_headers is None:
            lost[r] = True
            continue
        said[r] = when.evaluate(_message_facts(ex, f, row_headers, cols.bodies[r].as_py() if when.reads_body else b""))
    return said
