"""NServiceBus SQL-transport tables, both flavors, as the transports create them.

Facts: reference/nservicebus-target.md §1 (SQL Server: queue heap with a non-clustered
RowVersion index, `<queue>.Delayed`, `SubscriptionRouting`) and §2 (PostgreSQL: lower-case
unquoted columns, quoted table names, `seq serial`, `Due timestamptz`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.dialects import mssql
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.types import UserDefinedType

DELAYED_SUFFIX = "Delayed"
SUBSCRIPTION_TABLE = "SubscriptionRouting"


class _Serial(UserDefinedType):
    """PostgreSQL `serial` on a column that is not the primary key, as the transport declares `Seq`."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "SERIAL"


def _nvarchar_max() -> sa.types.TypeEngine:
    return sa.UnicodeText().with_variant(mssql.NVARCHAR(None), "mssql")


def _varbinary_max() -> sa.types.TypeEngine:
    return sa.LargeBinary().with_variant(mssql.VARBINARY("max"), "mssql")


def _row_version(name: str, backend: str) -> sa.Column:
    if backend == "sqlite":  # only INTEGER PRIMARY KEY auto-numbers in SQLite
        return sa.Column(name, sa.Integer, primary_key=True, autoincrement=True)
    return sa.Column(name, sa.BigInteger, sa.Identity(start=1, increment=1), nullable=False)


@dataclass
class TargetTables:
    """The transport tables of one target (flavor, schema, backend) in one MetaData."""

    flavor: str
    schema: str
    backend: str  # SQLAlchemy backend name of the target connection
    catalog: str | None = None
    metadata: sa.MetaData = field(default_factory=sa.MetaData)

    def _get(self, name: str) -> sa.Table | None:
        key = f"{self.schema}.{name}" if self.schema and self.backend != "sqlite" else name
        return self.metadata.tables.get(key)

    @property
    def table_schema(self) -> str | None:
        return None if self.backend == "sqlite" else self.schema

    def _fits(self, name: str) -> None:
        from bridge.errors import TargetSchemaError
        from bridge.identifiers import check_fits

        try:
            check_fits(name, self.backend, "target table")
        except ValueError as e:
            raise TargetSchemaError(f"{e}; route to a shorter queue name") from None

    def queue(self, name: str) -> sa.Table:
        found = self._get(name)
        if found is not None:
            return found
        self._fits(name)
        return self._pg_queue(name) if self.flavor == "postgresql" else self._mssql_queue(name)

    def delayed(self, queue: str) -> sa.Table:
        name = f"{queue}.{DELAYED_SUFFIX}"
        found = self._get(name)
        if found is not None:
            return found
        self._fits(name)
        return self._pg_delayed(name) if self.flavor == "postgresql" else self._mssql_delayed(name)

    def subscriptions(self) -> sa.Table:
        found = self._get(SUBSCRIPTION_TABLE)
        return found if found is not None else self._subscriptions()

    # -- PostgreSQL transport (PostgreSqlConstants.cs) ---------------------------------------
    def _pg_queue(self, name: str) -> sa.Table:
        if self.backend == "sqlite":
            # SQLite cannot number a non-key column; `seq` becomes the rowid, `id` stays unique.
            cols = [sa.Column("id", sa.Uuid, nullable=False, unique=True), _row_version("seq", "sqlite")]
        else:
            cols = [sa.Column("id", sa.Uuid, primary_key=True), sa.Column("seq", _Serial(), nullable=False, unique=True)]
        return sa.Table(
            name, self.metadata, *cols[:1],
            sa.Column("expires", sa.DateTime()),
            sa.Column("headers", sa.Text, nullable=False),
            sa.Column("body", sa.LargeBinary),
            *cols[1:],
            schema=self.table_schema,
        )

    def _pg_delayed(self, name: str) -> sa.Table:
        t = sa.Table(
            name, self.metadata,
            sa.Column("id", sa.Uuid, primary_key=True, server_default=self._random_uuid()),
            sa.Column("headers", sa.Text, nullable=False),
            sa.Column("body", sa.LargeBinary),
            sa.Column("due", sa.DateTime(timezone=True), nullable=False),
            schema=self.table_schema,
            postgresql_with={"fillfactor": 100},
        )
        sa.Index(f"{name}_Due", t.c.due)
        return t

    def _random_uuid(self) -> sa.TextClause | None:
        return sa.text("gen_random_uuid()") if self.backend == "postgresql" else None

    # -- SQL Server transport (SqlServerConstants.cs) ----------------------------------------
    def _mssql_queue(self, name: str) -> sa.Table:
        t = sa.Table(
            name, self.metadata,
            sa.Column("Id", sa.Uuid, nullable=False),
            sa.Column("CorrelationId", sa.String(255)),
            sa.Column("ReplyToAddress", sa.String(255)),
            sa.Column("Recoverable", sa.Boolean(create_constraint=False), nullable=False),
            sa.Column("Expires", sa.DateTime()),
            sa.Column("Headers", _nvarchar_max(), nullable=False),
            sa.Column("Body", _varbinary_max()),
            _row_version("RowVersion", self.backend),
            schema=self.table_schema,
        )
        if self.backend != "sqlite":
            sa.Index(self._index_name("Index_RowVersion", name), t.c.RowVersion, mssql_clustered=False)
        sa.Index(
            self._index_name("Index_Expires", name), t.c.Expires,
            mssql_include=["Id", "RowVersion"], mssql_where=t.c.Expires.isnot(None), mssql_clustered=False,
            postgresql_where=t.c.Expires.isnot(None),
        )
        return t

    def _mssql_delayed(self, name: str) -> sa.Table:
        t = sa.Table(
            name, self.metadata,
            sa.Column("Headers", _nvarchar_max(), nullable=False),
            sa.Column("Body", _varbinary_max()),
            sa.Column("Due", sa.DateTime(), nullable=False),
            _row_version("RowVersion", self.backend),
            schema=self.table_schema,
        )
        sa.Index(self._index_name("Index_Due", name), t.c.Due, mssql_clustered=False)
        return t

    def _index_name(self, base: str, table: str) -> str:
        # SQL Server scopes index names to their table; PostgreSQL and SQLite to the schema.
        return base if self.backend == "mssql" else f"{table}_{base}"

    # -- both --------------------------------------------------------------------------------
    def _subscriptions(self) -> sa.Table:
        if self.flavor == "postgresql":
            cols = ("queueaddress", "endpoint", "topic")
            kind: sa.types.TypeEngine = sa.String(200)
        else:
            cols = ("QueueAddress", "Endpoint", "Topic")
            kind = sa.Unicode(200)
        return sa.Table(
            SUBSCRIPTION_TABLE, self.metadata,
            sa.Column(cols[0], kind, nullable=False),
            sa.Column(cols[1], kind, primary_key=True),
            sa.Column(cols[2], kind, primary_key=True),
            schema=self.table_schema,
            postgresql_with={"fillfactor": 100},
        )

    def column(self, table: sa.Table, logical: str) -> sa.Column:
        """Columns by their SQL Server spelling whatever the flavor ("Headers" -> headers)."""
        return table.c[logical.lower() if self.flavor == "postgresql" else logical]

    def address(self, queue: str) -> str:
        """The transport address endpoints and ServiceControl use for `queue`."""
        if self.flavor == "sqlserver":
            def bracket(part: str) -> str:
                return "[" + part.replace("]", "]]") + "]"

            parts = [queue, bracket(self.schema)]
            if self.catalog:
                parts.append(bracket(self.catalog))
            return "@".join(parts)
        # A bare table name is a valid PostgreSQL-transport address resolved in the default
        # schema; other schemas use the documented quoted form (docs: transports/postgresql/addressing).
        if self.schema == "public" and '"' not in queue and "." not in queue:
            return queue

        def quoted(part: str) -> str:  # SQL's own rule inside a quoted identifier (inferred for the parser)
            return '"' + part.replace('"', '""') + '"'

        return f"{quoted(queue)}.{quoted(self.schema)}"


def create_statements(tables: list[sa.Table], dialect: sa.Dialect) -> list[str]:
    """DDL a DBA can review: one CREATE per table and index, guarded so re-running is harmless."""
    out: list[str] = []
    for table in tables:
        create = str(CreateTable(table, if_not_exists=dialect.name != "mssql").compile(dialect=dialect)).strip()
        indexes = [str(CreateIndex(ix, if_not_exists=dialect.name != "mssql").compile(dialect=dialect)).strip() for ix in sorted(table.indexes, key=lambda i: i.name or "")]
        if dialect.name == "mssql":
            full = dialect.identifier_preparer.format_table(table)
            body = "\n".join([create, *indexes])
            out.append(f"IF OBJECT_ID(N'{full.replace(chr(39), chr(39) * 2)}', N'U') IS NULL\nBEGIN\n{body}\nEND")
        else:
            out.extend([create, *indexes])
    return out

def transport_tables(flavor: str, schema: str, url: str | sa.URL, catalog: str | None) -> TargetTables:
    """The transport tables of one NServiceBus database (either side of a job)."""
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    return TargetTables(flavor, schema, backend, catalog or (parsed.database if backend == "mssql" else None))
