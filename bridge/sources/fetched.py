"""A batch of legacy rows as the driver returned them (issue 49): one tuple a row, the batch's
columns, keys and consumable flags, without a dict or a SourceRow a row. The columnar lane reads
the columns; a row's SourceRow is made only when something asks for that row (the rows the lane
leaves to the per-row lanes, or a caller that walks the rows), so a Fetched is a
Sequence[SourceRow] wherever a list of rows is taken, and gives the same rows a list would."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import sqlalchemy as sa

from bridge.sources.base import Source, SourceRow


class Fetched(Sequence[SourceRow]):
    """Rows of one result, in its order. `key_of` and `consumable_of` make a row's key and
    consumable flag from its column values, as the source's SourceRow would hold them."""

    __slots__ = ("_columns", "_rows", "_tuples", "consumable", "keys", "names")

    def __init__(self, names: Sequence[str], tuples: Sequence[Sequence[Any]], key: str,
                 key_of: Callable[[Any], Any], consumable: str, consumable_of: Callable[[Any], bool]) -> None:
        self.names = list(names)
        self._tuples = tuples
        self._rows: list[SourceRow | None] = [None] * len(tuples)
        self._columns: dict[str, Sequence[Any]] | None = None
        self.keys: list[Any] = [key_of(k) for k in self.column(key)]
        self.consumable: list[bool] = [consumable_of(v) for v in self.column(consumable)]

    def column(self, name: str) -> Sequence[Any]:
        """Every row's value of column `name`, in row order."""
        if self._columns is None:
            transposed = list(zip(*self._tuples)) if self._tuples else [() for _ in self.names]
            self._columns = dict(zip(self.names, transposed))
        return self._columns[name]

    def __len__(self) -> int:
        return len(self._rows)

    def tuples(self) -> Sequence[Sequence[Any]]:
        """Every row's values as the driver gave them, in `names`' order."""
        return self._tuples

    def _values(self, i: int) -> dict[str, Any]:
        return dict(zip(self.names, self._tuples[i]))

    @overload
    def __getitem__(self, i: int) -> SourceRow: ...

    @overload
    def __getitem__(self, i: slice) -> list[SourceRow]: ...

    def __getitem__(self, i: int | slice) -> SourceRow | list[SourceRow]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = self._rows[i]
        if row is None:
            row = self._rows[i] = SourceRow(self.keys[i], self.consumable[i], self._values(i))
        return row

    def __iter__(self) -> Iterator[SourceRow]:
        return (self[i] for i in range(len(self)))

    def __add__(self, other: Sequence[SourceRow]) -> Sequence[SourceRow]:
        if not other:
            return self
        if not self:
            return other
        if isinstance(other, Fetched) and other.names == self.names:
            return _joined(self, other)
        return [*self, *other]

    def __radd__(self, other: Sequence[SourceRow]) -> Sequence[SourceRow]:
        if not other:
            return self
        return [*other, *self]


def _joined(a: Fetched, b: Fetched) -> Fetched:
    """`a` then `b` (the same columns), keeping what each made already."""
    joined = Fetched.__new__(Fetched)
    joined.names = a.names
    joined._tuples = [*a.tuples(), *b.tuples()]
    joined._rows = [*a._rows, *b._rows]
    joined._columns = None
    joined.keys = [*a.keys, *b.keys]
    joined.consumable = [*a.consumable, *b.consumable]
    return joined


def fetched(result: sa.CursorResult, key: str, key_of: Callable[[Any], Any], consumable: str,
            consumable_of: Callable[[Any], bool]) -> Fetched:
    """A result's rows as the driver gives them, taken at once (iterating a result copies row by
    row): the columnar lane reads their columns, and a row's SourceRow (with its dict) is made
    only when something asks for that row."""
    names = [str(k) for k in result.keys()]  # noqa: SIM118 - a Result, not a dict: keys() are its column names
    return Fetched(names, result.fetchall(), key, key_of, consumable, consumable_of)


def keys_of(rows: Sequence[SourceRow]) -> list[Any]:
    """Each row's key, in order (a Fetched's without making its rows: its own list, to read, not to change)."""
    return rows.keys if isinstance(rows, Fetched) else [r.key for r in rows]


def consumable_of(rows: Sequence[SourceRow]) -> list[bool]:
    """Whether move mode may consume each row, in order (a Fetched's without making its rows: its
    own list, to read, not to change)."""
    return rows.consumable if isinstance(rows, Fetched) else [r.consumable for r in rows]


def values_at(rows: Sequence[SourceRow], take: Sequence[int], name: str) -> list[Any]:
    """Column `name` of the rows at `take` (a Fetched's from its column, without making its rows)."""
    if isinstance(rows, Fetched):
        column = rows.column(name)
        return list(column) if len(take) == len(column) else [column[i] for i in take]
    return [rows[i].values[name] for i in take]


def ledger_keys(source: Source, rows: Sequence[SourceRow]) -> list[str]:
    """`source.ledger_key` of each row (a Fetched's from its keys, where the source keeps a row
    under its key, as Source.ledger_key does)."""
    if isinstance(rows, Fetched) and type(source).ledger_key is Source.ledger_key:
        return [str(k) for k in rows.keys]
    return [source.ledger_key(r) for r in rows]


def joined(first: Sequence[SourceRow], then: Sequence[SourceRow]) -> Sequence[SourceRow]:
    """`first` then `then`, as one batch (two Fetched of one source stay a Fetched)."""
    if isinstance(first, Fetched):
        return first + then
    if isinstance(then, Fetched):
        return then.__radd__(first)
    return [*first, *then]
