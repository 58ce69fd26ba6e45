"""NGinn.MessageBus's tables: a queue's, as its createmqueue script defines it, and the subscriptions'."""

from __future__ import annotations

import sqlalchemy as sa


def queue_table(name: str, schema: str | None = None, metadata: sa.MetaData | None = None) -> sa.Table:
    """The queue table as NGinn's createmqueue script defines it (types per dialect)."""
    return sa.Table(
        name,
        metadata or sa.MetaData(),
        # SQLite only auto-numbers an INTEGER PRIMARY KEY.
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("from_endpoint", sa.String(50), nullable=False),
        sa.Column("to_endpoint", sa.String(50), nullable=False),
        sa.Column("subqueue", sa.CHAR(1), nullable=False),
        sa.Column("insert_time", sa.DateTime(), nullable=False),
        sa.Column("last_processed", sa.DateTime()),
        sa.Column("retry_count", sa.Integer(), nullable=False),
        sa.Column("retry_time", sa.DateTime(), nullable=False),
        sa.Column("error_info", sa.Text()),
        sa.Column("correlation_id", sa.String(100)),
        sa.Column("label", sa.String(100)),
        sa.Column("msg_text", sa.Text()),
        sa.Column("msg_headers", sa.Text()),
        sa.Column("unique_id", sa.String(40)),
        sa.Index(f"IDX_{name}_subqueue_retry_time", "subqueue", "retry_time"),
        schema=schema,
    )


def subscription_table(name: str, schema: str | None = None, metadata: sa.MetaData | None = None) -> sa.Table:
    return sa.Table(
        name,
        metadata or sa.MetaData(),
        sa.Column("publisher_endpoint", sa.String(200), primary_key=True),
        sa.Column("subscriber_endpoint", sa.String(200), primary_key=True),
        sa.Column("message_type", sa.String(300), primary_key=True),
        sa.Column("created_date", sa.DateTime(), nullable=False),
        sa.Column("expiration_date", sa.DateTime()),
        schema=schema,
    )
