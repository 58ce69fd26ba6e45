"""The columnar lane's NServiceBus side: a source's PlainColumns into transport rows, group by
group (bridge.sources.columns says why this is the fast lane's own code).

For each group, the target's real `plain_envelope` runs on the group's example. It gives the
queue, the kind, the outcome and the headers. The headers are rendered by the writer's own
`headers_json`, with the markers still in. That JSON text is a template: literal text between
markers. Each row's JSON is the template with its own values put in, escaped the way orjson
escapes them (a lane value holds no control character), plus the writer's `/` as `\\/`. A group
whose example comes back as anything but a plain Outgoing or a skip goes to the per-row lane:
None, a body, an expiry or a due time it did not give.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bridge.codecs.nservicebus import headers_json
from bridge.mapping import Mapping
from bridge.mapping_rules import FORCED
from bridge.sources.columns import DUE, FAILED, SENT, PlainColumns, mark, taken
from bridge.targets.base import Skipped
from bridge.targets.envelope import Outgoing
from bridge.targets.reshape import EXAMPLE, GiveBack
from bridge.timefmt import to_wire
from bridge.tracing import TRACEPARENT

_MARKER = re.compile(r"\\u0000(\w+)\\u0000")  # a marker as orjson writes it inside a JSON string
_STANDINS = {to_wire(SENT): mark("sent"), to_wire(DUE): mark("due"), to_wire(FAILED): mark("failed_at")}


@dataclass
class TableColumns:
    """Lane rows for one transport table, in batch order."""

    kind: str  # "queue" or "delayed"
    queue: str
    positions: np.ndarray  # each row's index in the batch
    headers: pa.Array  # string: the JSON text of each row's headers
    bodies: pa.Array  # binary
    due: pa.Array | None  # timestamp[us, UTC], for the delayed table
    traced: bool = False  # its rows have a `traceparent` header (every row of a group has its example's names)
    expires: datetime | None = None  # every row's expiry (a [[ttbr]] rule's), aware


@dataclass
class LaneOutcomes:
    """What the lane made of a batch's PlainColumns: rows per table, each lane row's outcome, and
    the rows it gave back to the per-row lane (indices into the PlainColumns' rows)."""

    tables: list[TableColumns] = field(default_factory=list)
    delivered: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (rows, ledger target)
    skipped: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (rows, reason)
    given_back: list[np.ndarray] = field(default_factory=list)


def lane_outcomes(cols: PlainColumns, envelope: object, ledger_target: object, mapping: Mapping | None = None
                  ) -> LaneOutcomes:
    """Runs `envelope` (the target's plain_envelope, translated bound) once per group and fills
    each group's rows in; `ledger_target` names where an Outgoing went, as the ledger records it.
    With `mapping`'s rules, the groups are split by what the rules hold first (lane_rules)."""
    done = LaneOutcomes()
    escaped: dict[str, pa.Array] = {}
    groups, ruled = cols.groups, None
    if mapping is not None and mapping.has_rules:
        from bridge.targets.lane_rules import refine

        ruled = refine(cols, mapping)
        groups = ruled.groups
        cols = replace(cols, values={**cols.values, **ruled.values},
                       bodies=cols.bodies if ruled.bodies is None else ruled.bodies)
    order = np.argsort(groups, kind="stable")
    bounds = np.flatnonzero(np.diff(groups[order])) + 1
    for rows in np.split(order, bounds):
        if not len(rows) or groups[rows[0]] < 0:
            if len(rows):
                done.given_back.append(rows)
            continue
        if ruled is None:
            out = envelope(cols.examples[int(groups[rows[0]])])  # type: ignore[operator]
        else:
            example, forced, said = ruled.examples[int(groups[rows[0]])]
            tokens = FORCED.set(forced), EXAMPLE.set(said)
            try:
                out = envelope(example)  # type: ignore[operator]
            except GiveBack:
                out = None
            finally:
                FORCED.reset(tokens[0])
                EXAMPLE.reset(tokens[1])
        if isinstance(out, Skipped) and "\x00" not in out.reason:
            done.skipped.append((rows, out.reason))
            continue
        if (not isinstance(out, Outgoing) or out.body != b"" or out.due not in (None, DUE)
                or (out.expires is not None and ruled is None)):  # only a [[ttbr]] rule gives the lane an expiry
            done.given_back.append(rows)
            continue
        parts = _template(out.headers)
        if parts is None or not _known(cols, parts[1::2]):
            done.given_back.append(rows)
            continue
        pieces: list[object] = []
        for i, part in enumerate(parts):
            pieces.append(part if i % 2 == 0 else _column(cols, escaped, part, rows))
        done.tables.append(TableColumns(
            out.kind, out.queue, cols.positions[rows], pc.binary_join_element_wise(*pieces, ""),
            taken(cols.bodies, rows), taken(cols.due, rows) if out.due is DUE and cols.due is not None else None,
            TRACEPARENT in out.headers, out.expires))
        done.delivered.append((rows, ledger_target(out)))  # type: ignore[operator]
    return done


def _template(headers: dict[str, str]) -> list[str] | None:
    """The headers' JSON split into literal text (even places) and marker names (odd places);
    None when a marker did not come through whole."""
    for wire, marker in _STANDINS.items():
        headers = {k: v.replace(wire, marker) for k, v in headers.items()} if any(wire in v for v in headers.values()) else headers
    parts = _MARKER.split(headers_json(headers))
    if any("\\u0000" in p for p in parts[0::2]):
        return None
    return parts


def _known(cols: PlainColumns, names: list[str]) -> bool:
    """Whether every marker the template names is a column the source gave (or a header value)."""
    return all(n in cols.values or (n[:1] == "L" and n[1:].isdigit()) for n in names)


def _escape(a: pa.Array) -> pa.Array:
    """Text as orjson writes it inside a JSON string when it holds no control character but a
    tab or a line break (a stack trace's), with the writer's `/` escape. Which of those bytes
    occur at all is counted on the array's UTF-8 buffer in one pass (each is ASCII, so a byte
    is the character); only those are replaced, `\\` first."""
    if len(a) == 0:
        return a
    kind = np.int64 if pa.types.is_large_string(a.type) else np.int32
    offsets = np.frombuffer(a.buffers()[1], dtype=kind)[a.offset:a.offset + len(a) + 1]
    data = a.buffers()[2]
    if data is None or offsets[-1] == offsets[0]:
        return a
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]], minlength=256)
    for raw, escaped in _ESCAPES:
        if counts[ord(raw)]:
            a = pc.replace_substring(a, raw, escaped)
    return a


_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("/", "\\/"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


def _column(cols: PlainColumns, escaped: dict[str, pa.Array], name: str, rows: np.ndarray) -> pa.Array:
    """Marker `name`'s escaped values for `rows`: a column of the PlainColumns, or L<k>, the k-th
    legacy header value of each row (every row of a group has the same header names)."""
    if name.startswith("L") and name[1:].isdigit():
        if "L" not in escaped:
            escaped["L"] = _escape(cols.header_values)
        return escaped["L"].take(pa.array(cols.header_starts[rows] + int(name[1:])))
    if name not in escaped:
        escaped[name] = cols.values[name] if name in cols.unescaped else _escape(cols.values[name])
    return taken(escaped[name], rows)
