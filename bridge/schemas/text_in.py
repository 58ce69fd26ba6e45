"""`column IN values` as one text PostgreSQL splits (issue 49), and the IN list elsewhere."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

# ASCII's unit separator: no system's key or message id holds it (a list with one that does is
# sent as an IN list).
TEXT_SEPARATOR = "\x1f"


def joined(values: Sequence[str]) -> str | None:
    """`values` as the one text `among` sends, or None where a value holds the separator (or there is none)."""
    text = TEXT_SEPARATOR.join(values)
    return text if text and text.count(TEXT_SEPARATOR) == len(values) - 1 else None


def among_text(column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
    """`among`'s PostgreSQL form with the joined text as the bound parameter `name`, for a
    statement built once and run with each batch's `joined` text."""
    return _any_of_text(column, sa.bindparam(name, type_=sa.Text))


def _any_of_text(column: sa.ColumnElement[Any], text: sa.BindParameter[Any]) -> sa.ColumnElement[bool]:
    split = sa.func.string_to_array(text, TEXT_SEPARATOR, type_=ARRAY(sa.Text))
    # As varchar[], as an IN list compares: a char(n) column's blank-padded values match it
    # too; a uuid column's values as uuid[] (uuid = varchar has no operator).
    element = column.type if isinstance(column.type, sa.Uuid) else sa.String()
    cast = sa.cast(split, ARRAY(element))
    matches = column == sa.any_(cast)
    # `any_` memoizes the cast's comparator, which refers back to the cast: a cycle that
    # kept each statement's joined text (~200 kB a 10k-key chunk) until a full collection,
    # rare in a long walk (verify's peak RSS at 2M handles was 1.30× that at 200k).
    cast._reset_memoizations()
    return matches


def among(column: sa.ColumnElement[Any], values: Sequence[str], dialect: str) -> sa.ColumnElement[bool]:
    """`column IN values`, sent to PostgreSQL as one text that the server splits: an IN list is a
    placeholder a value that SQLAlchemy renders and psycopg parses and sends on every statement
    (a 500-id fetch of OpenJMS handles spent more there than in the database, and a ledger
    lookup ~12 µs a key as a text[], issue 49).
    Elsewhere, or where a value holds the separator, the IN list."""
    if dialect == "postgresql":
        text = joined(values)
        if text is not None:
            return _any_of_text(column, sa.bindparam(None, text, type_=sa.Text))
    if isinstance(column.type, sa.Uuid) and column.type.as_uuid:
        return column.in_([uuid.UUID(v) for v in values])
    return column.in_(list(values))
