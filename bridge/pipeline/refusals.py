"""Rows the target refuses to store (issue 45): a value no encoder or column takes (a lone UTF-16
surrogate that Java wrote without complaint, a NUL in a text column of PostgreSQL, a value longer
than a legacy column) must cost that row, never the batch. A scan source
reads a bad row in every batch, so a batch that rolls back on it is a queue stalled for good.

A batch's write runs under a savepoint. Refused, the write is split in halves, each under a
savepoint of its own, down to the rows that are refused alone: k bad rows of n cost about
2·k·log2(n) writes, in the batch's row order, and only on the batches that hold one.

A broken constraint is not a row's refusal: a NOT NULL column qbridge does not write, or a
CHECK a DBA added, is the table's fault, which every row would break; the job stops naming it,
rather than quarantine the whole queue."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge.codecs.jsonsafe import writable
from bridge.errors import BridgeError

# What an encoder raises on a value it cannot take (orjson, a codec, struct, Arrow, a driver's
# adaptation of a parameter). A BridgeError (a missing table) is the job's, not a row's.
PYTHON_REFUSALS = (TypeError, ValueError, UnicodeError, OverflowError)
_UNSTORABLE = re.compile("[\ud800-\udfff\x00]")  # what unstorable() names


def refused(error: BaseException) -> bool:
    """Whether `error`, raised by a target's write, may be a row's fault rather than the batch's:
    an encoder or the database refused a value (a duplicate key is a ledger conflict, and a
    database that is down is retried: neither is a row's)."""
    if isinstance(error, BridgeError):
        return False
    if isinstance(error, sa_exc.DBAPIError):  # a constraint (IntegrityError) is the table's: a NOT NULL column
        # qbridge does not write, a CHECK a DBA added; every row breaks it, and the job stops saying so
        return isinstance(error, sa_exc.DataError)
    if isinstance(error, sa_exc.StatementError):  # a bind parameter's processing failed, before the driver
        return isinstance(error.orig, PYTHON_REFUSALS)
    return isinstance(error, PYTHON_REFUSALS)


def write_refusing(conn: sa.Connection, write: Callable[[sa.Connection, Sequence[Any]], None], outs: Sequence[Any]
                   ) -> list[tuple[int, str]]:
    """Writes `outs` in the caller's transaction; (index, why) of each one the target refused,
    which is not written (every other one is). An error that is no refusal is raised."""
    found: list[tuple[int, str]] = []

    def attempt(lo: int, hi: int) -> None:
        savepoint = conn.begin_nested()
        try:
            write(conn, outs[lo:hi])
        except Exception as e:
            savepoint.rollback()
            if not refused(e):
                raise
            if hi - lo == 1:
                found.append((lo, why_refused(outs[lo], e)))
                return
            middle = (lo + hi) // 2
            attempt(lo, middle)
            attempt(middle, hi)
            return
        savepoint.commit()

    if outs:
        attempt(0, len(outs))
    return found


def why_refused(out: Any, error: BaseException) -> str:
    """The quarantine reason of a refused row: the value that cannot be stored, where it can be
    told, and what refused it, in words a text column of any database holds."""
    value = unstorable(out)
    said = str(getattr(error, "orig", None) or error).strip().splitlines()
    told = f"{type(getattr(error, 'orig', None) or error).__name__}: {said[0] if said else ''}"
    where = f"{value}; " if value else ""
    return writable(f"the target cannot store this message: {where}{told}")[:500]


def unstorable(value: Any, path: str = "") -> str | None:
    """Where in a row to write the first text no database stores as it is: a lone UTF-16
    surrogate (no UTF-8 or UTF-16 encoder takes it) or a NUL (PostgreSQL's text refuses it)."""
    if isinstance(value, str):
        if (m := _UNSTORABLE.search(value)) is None:
            return None
        ch = m.group()
        what = "a NUL character (" if ch == "\x00" else f"a lone UTF-16 surrogate (U+{ord(ch):04X} "
        return f"{path or 'a value'} holds {what}at character {m.start()})"
    if isinstance(value, dict):
        for k, v in value.items():
            found = unstorable(k, f"{path} name {writable(repr(k))}") or unstorable(v, f"{path}[{writable(repr(k))}]")
            if found:
                return found.lstrip()
        return None
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        for name, v in zip(value._fields, value):
            if (found := unstorable(v, f"{path}.{name}" if path else name)) is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if (found := unstorable(v, f"{path}[{i}]")) is not None:
                return found
        return None
    fields = getattr(value, "__dataclass_fields__", None)
    if fields:
        for name in fields:
            if (found := unstorable(getattr(value, name), f"{path}.{name}" if path else name)) is not None:
                return found
    return None
