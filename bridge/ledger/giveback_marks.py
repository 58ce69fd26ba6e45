"""Marks a move-mode rollback leaves in a legacy database whose receiver deletes what it consumes
(OpenJMS, BizTalk): there, giving a message back re-inserts its rows, and once the legacy
receiver has taken them again nothing of them is left to tell a later attempt that an earlier
one committed. So each give-back writes, in the same legacy transaction, one mark per message
carrying the token its owed row got in the withdrawal (`bridge.ledger.giveback.owe`): an attempt
after a kill gives back only what has no mark. A token is new with every withdrawal, so a mark
left over from an earlier rollback of the same message never matches.

Bounded: `bridge.ledger.giveback.finish` deletes a queue's marks once nothing of it is owed, and every
rollback does before it starts; a kill just before that leaves the marks of the give-backs that
`finish` call made (normally one batch, 1,000) until the queue's next rollback."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from bridge.timefmt import naive_utc, utcnow

MARKS = "qbridge_giveback_marks"
TOKEN_LENGTH = 32  # uuid4().hex
STATEMENT_KEYS = 500


def marks_table(schema: str | None, metadata: sa.MetaData | None = None) -> sa.Table:
    return sa.Table(
        MARKS, metadata if metadata is not None else sa.MetaData(),
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("queue", sa.String(128), primary_key=True),
        sa.Column("token", sa.String(TOKEN_LENGTH), primary_key=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        schema=schema,
    )


def marked(conn: sa.Connection, t: sa.Table, job: str, queue: str, tokens: list[str]) -> set[str]:
    """The tokens among `tokens` whose give-back committed."""
    found: set[str] = set()
    for start in range(0, len(tokens), STATEMENT_KEYS):
        found.update(conn.execute(sa.select(t.c.token).where(
            t.c.job == job, t.c.queue == queue, t.c.token.in_(tokens[start:start + STATEMENT_KEYS]))).scalars())
    return found


def mark(conn: sa.Connection, t: sa.Table, job: str, queue: str, tokens: Iterable[str]) -> None:
    now = naive_utc(utcnow())
    rows = [{"job": job, "queue": queue, "token": tok, "at": now} for tok in tokens]
    if rows:
        conn.execute(sa.insert(t), rows)


def forget(conn: sa.Connection, t: sa.Table, job: str, queue: str) -> int:
    return int(conn.execute(sa.delete(t).where(t.c.job == job, t.c.queue == queue)).rowcount or 0)


def kept(engine: sa.Engine, schema: str | None) -> bool:
    """Whether the legacy database has the marks table (`qbridge init` makes it)."""
    with engine.connect() as conn:
        return sa.inspect(conn).has_table(MARKS, schema=schema)
