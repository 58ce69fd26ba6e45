"""`qbridge init`: the tables a config needs, printed for a DBA or created if missing.

A forward job needs the NServiceBus tables and qbridge's state tables in its target. A reverse
job needs the proxy queues it reads on the NServiceBus side, and its legacy tables and qbridge's
state tables on the legacy side (the ledger lives beside the rows it guards).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from bridge.config import Config, JobConfig
from bridge.db import dialect_for, engine_for
from bridge.errors import TargetSchemaError
from bridge.state import state_tables
from bridge.targets import target_class
from bridge.targets.base import Target
from bridge.targets.nservicebus import create_statements
from bridge.targets.nservicebus_target import transport_tables


@dataclass
class TargetPlan:
    """Every table one connection + schema needs, across the jobs that use it."""

    connection: str
    url: str
    schema: str | None  # where the tables go (None: the database's default)
    label: str  # what the tables are for, in `--print-sql` output
    tables: list[sa.Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)  # whose notes go with the DDL

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    @property
    def backend(self) -> str:
        return sa.engine.make_url(self.url).get_backend_name()

    def add(self, table: sa.Table) -> None:
        if table.fullname not in {t.fullname for t in self.tables}:
            self.tables.append(table)


def plan(config: Config, jobs: list[JobConfig]) -> list[TargetPlan]:
    plans: dict[tuple[str, str | None], TargetPlan] = {}

    def at(connection: str, schema: str | None, label: str) -> TargetPlan:
        key = (connection, schema)
        if key not in plans:
            plans[key] = TargetPlan(connection, config.connections[connection], schema, label)
        return plans[key]

    for job in jobs:
        url = config.connections[job.target.connection]
        target = target_class(job.target.system)(job, url, config.mapping(job))
        schema = target.state_schema
        label = (f"flavor {job.target.flavor}, schema {job.target.schema_name}" if job.target.system == "nservicebus"
                 else f"{job.target.system} legacy store, schema {schema or '(default)'}")
        p = at(job.target.connection, schema, label)
        for t in state_tables(schema).values():
            p.add(t)
        for t in target.tables():
            p.add(t)
        p.targets.append(target)
        if job.reverse:
            src = job.source
            assert src.flavor is not None
            nsb_url = config.connections[src.connection]
            transport = transport_tables(src.flavor, src.schema_name, nsb_url, src.catalog)
            q = at(src.connection, transport.table_schema, f"NServiceBus proxy queues, flavor {src.flavor}, schema {src.schema_name}")
            for queue in src.queues:
                q.add(transport.queue(queue))
                q.add(transport.delayed(queue))
            q.add(transport.subscriptions())
    return list(plans.values())


def ddl(p: TargetPlan) -> list[str]:
    return create_statements(p.tables, dialect_for(p.url))


def notes(p: TargetPlan) -> list[str]:
    dialect = dialect_for(p.url)
    return [n for t in p.targets for n in t.notes(dialect)]


def create_missing(p: TargetPlan) -> tuple[list[str], list[str]]:
    """Creates the tables that do not exist yet; returns (created, already there)."""
    engine = engine_for(p.url)
    schema = p.schema
    with engine.begin() as conn:
        insp = sa.inspect(conn)
        if schema and engine.dialect.name != "sqlite" and schema not in insp.get_schema_names():
            raise TargetSchemaError(f"schema {schema!r} does not exist in {p.connection!r}; create it first")
        existing = [t.name for t in p.tables if insp.has_table(t.name, schema=t.schema)]
        for t in p.tables:
            t.create(conn, checkfirst=True)
    created = [n for n in p.names if n not in existing]
    return created, existing
