"""`qbridge init`: the target tables a config needs, printed for a DBA or created if missing."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from bridge.config import Config, JobConfig
from bridge.db import engine_for
from bridge.errors import TargetSchemaError
from bridge.state import state_tables
from bridge.targets.nservicebus import TargetTables, create_statements


@dataclass
class TargetPlan:
    """Every table one target connection + schema needs, across the jobs writing there."""

    connection: str
    url: str
    tables: TargetTables
    names: list[str] = field(default_factory=list)

    def add(self, table: sa.Table) -> None:
        if table.name not in self.names:
            self.names.append(table.name)


def plan(config: Config, jobs: list[JobConfig]) -> list[TargetPlan]:
    plans: dict[tuple[str, str, str], TargetPlan] = {}
    for job in jobs:
        url = config.connections[job.target.connection]
        backend = sa.engine.make_url(url).get_backend_name()
        key = (job.target.connection, job.target.flavor, job.target.schema_name)
        if key not in plans:
            tables = TargetTables(job.target.flavor, job.target.schema_name, backend, job.target.catalog)
            plans[key] = TargetPlan(job.target.connection, url, tables)
            for t in state_tables(tables.table_schema, tables.metadata).values():
                plans[key].add(t)
        p = plans[key]
        mapping = config.mapping(job)
        states = mapping.states
        for queue in mapping.target_queues():
            p.add(p.tables.queue(queue))
            if "delayed" in (states.ready, states.delayed, states.failed):
                p.add(p.tables.delayed(queue))
        if "error" in (states.ready, states.delayed, states.failed, states.expired):
            p.add(p.tables.queue(job.target.error_queue))
        if "audit" in (states.ready, states.delayed, states.failed, states.processed, states.expired):
            p.add(p.tables.queue(job.target.audit_queue))
        p.add(p.tables.subscriptions())
    return list(plans.values())


def ddl(p: TargetPlan) -> list[str]:
    dialect = sa.create_engine(p.url).dialect
    tables = [p.tables.metadata.tables[k] for k in _keys(p)]
    return create_statements(tables, dialect)


def _keys(p: TargetPlan) -> list[str]:
    schema = p.tables.table_schema
    return [f"{schema}.{n}" if schema else n for n in p.names]


def create_missing(p: TargetPlan) -> tuple[list[str], list[str]]:
    """Creates the tables that do not exist yet; returns (created, already there)."""
    engine = engine_for(p.url)
    schema = p.tables.table_schema
    with engine.begin() as conn:
        insp = sa.inspect(conn)
        if schema and engine.dialect.name != "sqlite" and schema not in insp.get_schema_names():
            raise TargetSchemaError(f"schema {schema!r} does not exist in target {p.connection!r}; create it first")
        existing = [n for n in p.names if insp.has_table(n, schema=schema)]
        tables = [p.tables.metadata.tables[k] for k in _keys(p)]
        p.tables.metadata.create_all(conn, tables=tables, checkfirst=True)
    created = [n for n in p.names if n not in existing]
    return created, existing
