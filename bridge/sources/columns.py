"""A batch's common-case rows as Arrow columns: what a source hands the columnar lane (issue 37).

The lane does per batch what the fast lane does per row, without building a message, a header
dict or a JSON document per row. Rows that share everything the mapping's code looks at (the
header names in their order, the legacy type, the destination, the reply address, the state and
which optional columns are empty) form a group. For each group the source builds ONE
PlainMessage, the group's example. Its real values are those the code looks at, and every value
the code only passes through (a header's value, the key, the message id, the sender) is a
marker. The target runs its real `plain_envelope` on the example. That gives it the group's
header names in their order, with the markers where each row's own values go. The target fills
those in column by column. So the lane cannot order, name or drop a header differently from the
fast lane: it runs the same code, once per group instead of once per row.

A marker is a name between two NULs. No lane row holds a NUL or any other control character
than a stack trace's line breaks and tabs, because those rows stay on the validated path.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bridge.model import PlainMessage

# Stand-ins for the times a header is made of. to_wire() renders them as text no real time has
# (year 1), and the target swaps that text for the row's own.
SENT = datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
DUE = datetime(1, 1, 1, 0, 0, 0, 2, tzinfo=UTC)
FAILED = datetime(1, 1, 1, 0, 0, 0, 3, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def mark(name: str) -> str:
    """The marker of value column `name` (letters, digits and `_`)."""
    return f"\x00{name}\x00"


@dataclass
class PlainColumns:
    """The lane's rows of one batch, in batch order. Every array has one entry per lane row."""

    positions: np.ndarray  # each lane row's index in the batch (int64, increasing)
    groups: np.ndarray  # each lane row's group: an index into `examples` (int64)
    examples: list[PlainMessage]  # one per group, with markers for the values it passes through
    values: dict[str, pa.Array]  # marker name -> the rows' own text for it (string; unescaped)
    header_values: pa.Array  # every lane row's legacy header values, row after row (string)
    header_starts: np.ndarray  # where each lane row's values start there: marker L<k> is [start + k]
    bodies: pa.Array  # binary: the message bodies
    sent: pa.Array  # timestamp[us, UTC]: when each was sent (for the lag)
    due: pa.Array | None  # timestamp[us, UTC]: when a delayed message is due (null for others)
    mids: list[str]  # each lane row's message id
    keys: list[str]  # each lane row's ledger key
    # The value columns that hold only digits, hex, `-`, `:` and spaces (ids, integer keys,
    # counts, wire times), which JSON text takes as they are: no escaping pass over them.
    unescaped: frozenset[str] = frozenset({"mid", "key", "retry", "sent", "due", "failed_at"})
    # Each lane row's body as the source parsed it (orjson.loads of `bodies`, a dict), where it
    # did (NGinn reads a body's $type): the body rules take it rather than parse again. Theirs to change.
    docs: list[Any] | None = None


def taken(a: pa.Array, index: np.ndarray) -> pa.Array:
    """a.take(index); `a` itself where `index` is each of its places in order and `a` starts at
    its buffers' start (most batches keep every row of every group: a copy of each column saved)."""
    n = len(index)
    if n == len(a) and a.offset == 0 and (n == 0 or (index[0] == 0 and index[-1] == n - 1
                                                     and bool(np.array_equal(index, np.arange(n))))):
        return a
    return a.take(pa.array(index))


def np_bool(a: pa.Array) -> np.ndarray:
    """A boolean Arrow array as numpy, null as False."""
    return np.asarray(pc.fill_null(a, False).to_numpy(zero_copy_only=False), dtype=bool)


def wire(utc: pa.Array) -> pa.Array:
    """`yyyy-MM-dd HH:mm:ss:ffffff Z`, as bridge.timefmt.to_wire writes it (null stays null). A
    batch's times fall in a few seconds: each second is written once, its microseconds per row
    (Arrow's strftime costs ~1 us a value)."""
    us = np.asarray(pc.fill_null(utc.cast(pa.int64()), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    seconds, micro = np.divmod(us, 1_000_000)
    unique, at = np.unique(seconds, return_inverse=True)
    heads = pa.array([_head(_EPOCH + timedelta(seconds=s)) for s in unique.tolist()], pa.string())
    tails = pc.utf8_slice_codeunits(pa.array(micro + 1_000_000).cast(pa.string()), 1)
    text = pc.binary_join_element_wise(heads.take(pa.array(at)), tails, " Z", "")
    return pc.if_else(pc.is_valid(utc), text, pa.scalar(None, pa.string()))


def _head(t: datetime) -> str:
    """A wire time's text up to its microseconds, as to_wire pads it (strftime's %Y may not)."""
    return "%04d-%02d-%02d %02d:%02d:%02d:" % (t.year, t.month, t.day, t.hour, t.minute, t.second)  # noqa: UP031 - fast


def wire_where(utc: pa.Array, where: pa.Array) -> pa.Array:
    """_wire of the rows `where` holds, null for the others (a column only some states need)."""
    at = np.flatnonzero(np_bool(where))
    index = np.full(len(utc), -1, dtype=np.int64)
    index[at] = np.arange(len(at))
    return wire(utc.take(pa.array(at))).take(pa.array(index, mask=index < 0))
