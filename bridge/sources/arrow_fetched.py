"""A batch read as Arrow columns by ADBC's PostgreSQL driver (issue 49): what a copy-mode read-ahead
reads on a connection of its own (bridge/pipeline/read_ahead.py).

The driver reads the result by COPY BINARY and makes its Arrow columns in C++, without Python's
lock: beside a pass's own Python work it runs in parallel, where psycopg's rows (a Python object a
value) take turns with it. The columnar lane takes the columns as they are; a row's Python values
(the same a psycopg row holds: a test holds them to it) are made only when something asks for
them, a column at a time.

Only columns whose values Python holds alike either way are read so (integers, text, timestamps
without a zone); a result with another type, or a time Python's datetime cannot hold, is no
ArrowFetched (NotArrow), and the pass reads itself as before."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from bridge.sources.fetched import Fetched

_EPOCH = datetime(1970, 1, 1)
# datetime's own range, in microseconds since the epoch: PostgreSQL's (and its ±infinity) is wider.
_LOWEST = (datetime.min - _EPOCH) // timedelta(microseconds=1)
_HIGHEST = (datetime.max - _EPOCH) // timedelta(microseconds=1)
# Rows whose values are made one by one from the arrays (~1 µs a value) before every column is made
# Python's at once (~0.1 µs a value, and memory for the whole batch).
SCALAR_ROWS = 64


class NotArrow(Exception):
    """A result the read-ahead does not take as Arrow columns (the pass reads it itself);
    `lasting`: its columns' types, which later results share."""

    def __init__(self, why: str, lasting: bool) -> None:
        super().__init__(why)
        self.lasting = lasting


# PostgreSQL's types whose values Arrow gives Python as psycopg does (`money` is an int64 of cents
# there, `oid` an int32 that wraps, and others are Arrow's extension types).
SAME_IN_PYTHON = {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64(), "text": pa.string(),
                  "varchar": pa.string(), "bpchar": pa.string(), "timestamp": pa.timestamp("us")}


def _same_in_python(f: pa.Field) -> bool:
    pg = (f.metadata or {}).get(b"POSTGRESQL:type")
    return pg is not None and SAME_IN_PYTHON.get(pg.decode()) == f.type


class ArrowFetched(Fetched):
    """A Fetched whose columns are Arrow arrays; each column's Python values made on first use."""

    __slots__ = ("_arrays", "_scalar_rows")

    def __init__(self, table: pa.Table, key: str, key_of: Callable[[Any], Any], consumable: str,
                 consumable_of: Callable[[Any], bool]) -> None:
        table = table.combine_chunks()
        for f in table.schema:
            if not _same_in_python(f):
                pg = (f.metadata or {}).get(b"POSTGRESQL:type", b"?").decode()
                raise NotArrow(f"column {f.name} is PostgreSQL's {pg}, Arrow's {f.type}", True)
            if table.column(f.name).num_chunks > 1:  # over 2 GiB of text: the per-row lanes take the batch
                raise NotArrow(f"column {f.name} is {table.column(f.name).num_chunks} chunks", False)
        self._arrays = {n: (table.column(n).chunk(0) if table.column(n).num_chunks else pa.array([], table.schema.field(n).type))
                        for n in table.column_names}
        for n, a in self._arrays.items():
            if pa.types.is_timestamp(a.type) and a.null_count < len(a):
                low, high = pc.min_max(a.cast(pa.int64())).values()
                if low.as_py() < _LOWEST or high.as_py() > _HIGHEST:
                    raise NotArrow(f"column {n} holds a time outside Python's datetime", False)
        self.names = list(table.column_names)
        self._columns = {}
        self._tuples = ()  # made from the columns only if asked for (tuples)
        self._scalar_rows = 0
        self._rows = [None] * table.num_rows
        self.keys = [key_of(k) for k in self.column(key)]
        self.consumable = [consumable_of(v) for v in self.column(consumable)]

    def column(self, name: str) -> Sequence[Any]:
        assert self._columns is not None
        values = self._columns.get(name)
        if values is None:
            values = self._columns[name] = self._arrays[name].to_pylist()
        return values

    def tuples(self) -> Sequence[Sequence[Any]]:
        return list(zip(*(self.column(n) for n in self.names)))

    def _values(self, i: int) -> dict[str, Any]:
        """Row `i`'s values: from the Arrow arrays for the first few rows asked for (a group's
        example), from each column's Python values once more are (the per-row lanes' rows)."""
        assert self._columns is not None
        if len(self._columns) < len(self.names) and self._scalar_rows < SCALAR_ROWS:
            self._scalar_rows += 1
            return {n: (self._columns[n][i] if n in self._columns else self._arrays[n][i].as_py()) for n in self.names}
        return {n: self.column(n)[i] for n in self.names}

    def array(self, name: str, take: Sequence[int]) -> pa.Array:
        """Column `name` of the rows at `take`, as Arrow."""
        a = self._arrays[name]
        return a if len(take) == len(a) else a.take(pa.array(take, pa.int64()))


def read_arrow(cursor: Any, stmt: sa.Select, key: str, key_of: Callable[[Any], Any], consumable: str,
               consumable_of: Callable[[Any], bool]) -> ArrowFetched:
    """`stmt`'s rows by an ADBC PostgreSQL `cursor` (its values written into the statement: the
    callers' are integers and the statement's own names)."""
    # Named parameters: a `%` in a quoted name is not doubled as pyformat's escape.
    sql = str(stmt.compile(dialect=postgresql.dialect(paramstyle="named"), compile_kwargs={"literal_binds": True}))
    cursor.execute(sql)
    return ArrowFetched(cursor.fetch_arrow_table(), key, key_of, consumable, consumable_of)
