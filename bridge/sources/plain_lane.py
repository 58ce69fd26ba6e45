"""The columnar lane for sources whose rows are decoded one by one (OpenJMS's Java blobs,
BizTalk's context and part blobs): a Java stream or a BizTalk blob is not columnar, so each row
still becomes its PlainMessage exactly as the fast lane makes it (`Source.plain`). What joins the
lane is the rest: the rows that share everything the mapping's code looks at form a group, the
target runs its real `plain_envelope` once per group on an example with markers, and the headers'
JSON and the write are made column by column (bridge.sources.columns says why this is the fast
lane's own code).

A row stays on the per-row lanes when `plain` gives it none, or any text the lane passes through
(a header value, the key, the correlation or conversation id, a failure's fields) holds a control
character other than a tab or a line break, or text UTF-8 cannot encode (a lone surrogate).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from bridge.model import MESSAGE_MAX, FailureInfo, PlainMessage
from bridge.sources.columns import DUE, FAILED, SENT, PlainColumns, mark, wire, wire_where

if TYPE_CHECKING:
    from bridge.sources.base import Source, SourceRow

_LANE_STATES = frozenset({"ready", "delayed", "failed", "processed"})
# orjson writes these as \\uXXXX or \\b, \\f; the lane's escaping knows only \\n, \\r and \\t.
_ODD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_TIME = pa.timestamp("us", "UTC")


def decoded_columns(source: Source, rows: Sequence[SourceRow], take: Sequence[int], mids: Sequence[str]
                    ) -> PlainColumns | None:
    """`Source.plain_columns` of a source that decodes row by row: each row at `take` (with its
    message id in `mids`) made into its PlainMessage by the source's fast lane, `plain`."""
    return plain_columns_of((i, source.plain(rows[i], mid)) for i, mid in zip(take, mids))


def plain_columns_of(plains: Iterable[tuple[int, PlainMessage | None]]) -> PlainColumns | None:
    """The lane's columns of (batch position, the row's PlainMessage or None) in batch order, or
    None when no row can take the lane."""
    rows = [(at, p) for at, p in plains if p is not None and p.state in _LANE_STATES]
    grouped = _grouped(rows, each=False)
    if grouped is None:  # some row's text would not pass: each row is judged on its own
        grouped = _grouped(rows, each=True)
    assert grouped is not None
    examples, positions, groups, taken, header_values, starts = grouped
    if not taken:
        return None
    sent = pa.array([p.time_sent for p in taken], _TIME)
    due = pa.array([p.due for p in taken], _TIME)
    failures = [p.failure for p in taken]
    failed = pa.array([f is not None for f in failures])
    failed_at = pa.array([f.time_of_failure if f else None for f in failures], _TIME)
    values = {
        "mid": pa.array([p.message_id for p in taken], pa.string()),
        "key": pa.array([p.key for p in taken], pa.string()),
        "corr": pa.array([p.correlation_id or "" for p in taken], pa.string()),
        "conv": pa.array([p.conversation_id or "" for p in taken], pa.string()),
        "sent": wire(sent),
        "due": wire_where(due, pa.array([p.due is not None for p in taken])),
        "failed_at": wire_where(failed_at, failed),
        "etype": pa.array([f.exception_type if f else "" for f in failures], pa.string()),
        "emsg": pa.array([f.message[:MESSAGE_MAX] if f else "" for f in failures], pa.string()),
        "stack": pa.array([f.stack_trace if f else "" for f in failures], pa.string()),
        "inner": pa.array([(f.inner_exception_type or "") if f else "" for f in failures], pa.string()),
    }
    return PlainColumns(
        positions=np.array(positions, dtype=np.int64),
        groups=np.array(groups, dtype=np.int64),
        examples=examples,
        values=values,
        header_values=pa.array(header_values, pa.string()),
        header_starts=np.array(starts, dtype=np.int64),
        bodies=pa.array([p.body for p in taken], pa.binary()),
        sent=sent,
        due=due,
        mids=[p.message_id for p in taken],
        keys=[p.key for p in taken],
        unescaped=frozenset({"mid", "sent", "due", "failed_at"}),  # a scan source's key is any text
    )


def _grouped(rows: list[tuple[int, PlainMessage]], each: bool
             ) -> tuple[list[PlainMessage], list[int], list[int], list[PlainMessage], list[str], list[int]] | None:
    """(examples, positions, groups, PlainMessages, header values, each row's first header value)
    of the rows that take the lane. The text a row passes through is judged for the whole batch
    at once (`each` False: None if any row's would not pass) or row by row (`each` True: such a
    row stays off the lane); the names the example keeps real are in its group's key, so they are
    judged once a group."""
    shapes: dict[tuple, int] = {}
    examples: list[PlainMessage] = []
    positions: list[int] = []
    groups: list[int] = []
    taken: list[PlainMessage] = []
    header_values: list[str] = []
    starts: list[int] = []
    passed: list[str] = []
    for at, p in rows:
        f = p.failure
        if each and not _passes([*p.headers.values(), p.key, p.correlation_id or "", p.conversation_id or "",
                                 *((f.exception_type, f.message, f.stack_trace, f.inner_exception_type or "") if f else ())]):
            continue
        # An id is a marker where the row has one, so the key tells "has one" from None and "".
        shape = (p.state, p.destination, p.reply_to, tuple(p.enclosed_types), p.content_type, p.priority,
                 _has(p.correlation_id), _has(p.conversation_id),
                 p.due is None, tuple(p.headers),
                 None if f is None else (f.failed_queue, _has(f.inner_exception_type)))
        g = shapes.get(shape)
        if g is None:
            # What the example keeps real is rendered as the template's literal text: a NUL there could
            # spell a marker (a property named "\x00key\x00" would be filled with the row's key).
            real = [*p.headers, *p.enclosed_types, p.destination, p.reply_to or "", p.content_type or "",
                    *((f.failed_queue,) if f else ())]
            if "\x00" in "".join(real):
                g = shapes[shape] = -1
            else:
                g = shapes[shape] = len(examples)
                examples.append(_example(p))
        if g < 0:
            continue
        positions.append(at)
        groups.append(g)
        taken.append(p)
        starts.append(len(header_values))
        header_values += p.headers.values()
        if not each:
            passed += (p.key, p.correlation_id or "", p.conversation_id or "")
            if f:
                passed += (f.exception_type, f.message, f.stack_trace, f.inner_exception_type or "")
    if not each and not (_passes(header_values) and _passes(passed)):
        return None
    return examples, positions, groups, taken, header_values, starts


def _passes(texts: list[str]) -> bool:
    """Whether text the lane passes through holds no control character but a tab or a line break,
    and nothing UTF-8 cannot encode (a lone surrogate)."""
    text = "\t".join(texts)
    return not _ODD.search(text) and _encodes(text)


def _has(value: str | None) -> object:
    """A value the example replaces with a marker, as a group key: True when the row has one,
    else the value itself (None and "" are handled differently by the envelope)."""
    return True if value else value


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _example(p: PlainMessage) -> PlainMessage:
    """The group's example: `p` with markers where the rows' own values go, its real values where
    the mapping's code looks at them (state, names, routes, types, reply queue, priority)."""
    f = p.failure
    failure = None if f is None else FailureInfo(mark("etype"), mark("emsg"), mark("stack"), f.failed_queue, FAILED,
                                                 mark("inner") if f.inner_exception_type else f.inner_exception_type)
    return p._replace(message_id=mark("mid"), key=mark("key"),
                      correlation_id=mark("corr") if p.correlation_id else p.correlation_id,
                      conversation_id=mark("conv") if p.conversation_id else p.conversation_id,
                      time_sent=SENT, due=None if p.due is None else DUE,
                      headers={name: mark(f"L{k}") for k, name in enumerate(p.headers)}, body=b"", failure=failure)
