"""`qbridge init`: the tables a config needs, printed for a DBA or created if missing.

A forward job needs the NServiceBus tables and qbridge's state tables in its target. A reverse
job needs the proxy queues it reads on the NServiceBus side, and its legacy tables and qbridge's
state tables on the legacy side (the ledger lives beside the rows it guards). A forward move-mode
job of a system whose receiver deletes what it consumes (OpenJMS, BizTalk) also gets
`qbridge_giveback_marks` in its legacy database, which its rollback writes (bridge.ledger.giveback_marks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import sqlalchemy as sa

from bridge.config import Config, JobConfig
from bridge.db import dialect_for, engine_for, read_only_engine, sqlite_file
from bridge.errors import TargetSchemaError
from bridge.ledger.giveback_marks import marks_table
from bridge.ledger.ranges_upgrade import add_ranges
from bridge.ledger.state import ledger_table, state_tables
from bridge.ledger.totals import totals_table
from bridge.ledger.upgrade import NEW, TOTALS_NEW, QueueOrigin, add_groups, add_totals, conversion, convert, totals_sql
from bridge.pipeline.loop import database_identity
from bridge.schemas.nservicebus import create_statements, transport_tables
from bridge.sources import source_class
from bridge.targets import target_class
from bridge.targets.base import Target


@dataclass
class TargetPlan:
    """Every table one connection + schema needs, across the jobs that use it."""

    connection: str
    url: str
    schema: str | None  # where the tables go (None: the database's default)
    label: str  # what the tables are for, in `--print-sql` output
    tables: list[sa.Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)  # whose notes go with the DDL
    # Every queue of the config whose ledger entries live here (all jobs, not only those
    # selected): what converting an earlier ledger needs (bridge.ledger.upgrade).
    origins: list[QueueOrigin] = field(default_factory=list)
    has_state: bool = False  # qbridge's state tables go here (in `schema`)

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
        p.has_state = True
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
        elif job.mode == "move" and source_class(job.source.system).marks_give_backs:
            schema = job.source.schema_
            at(job.source.connection, schema, f"{job.source.system} legacy database, schema {schema or '(default)'}: "
                                              "move-mode rollback marks").add(marks_table(schema))
    for job in config.jobs:
        url = config.connections[job.target.connection]
        schema = target_class(job.target.system)(job, url, config.mapping(job)).state_schema
        here = plans.get((job.target.connection, schema))
        if here is not None:
            identity = database_identity(job, config.connections[job.source.connection])
            here.origins += [QueueOrigin(job.name, q, job.source.system, identity) for q in job.source.queues]
    return list(plans.values())


def ddl(p: TargetPlan) -> list[str]:
    return create_statements(p.tables, dialect_for(p.url))


def notes(p: TargetPlan) -> list[str]:
    dialect = dialect_for(p.url)
    return [n for t in p.targets for n in t.notes(dialect)]


def conversion_sql(p: TargetPlan) -> list[str]:
    """For a DBA: the statements that convert a ledger made before the (origin, source key)
    layout, with every queue of the config (`init` checks first that no entry belongs to another)."""
    if not p.has_state:
        return []
    dialect = dialect_for(p.url)
    new = ledger_table(p.schema, name=NEW)
    return [*create_statements([new], dialect), *_one_transaction(dialect, conversion(dialect, p.schema, p.origins).statements)]


def _one_transaction(dialect: sa.Dialect, statements: list[sa.Executable]) -> list[str]:
    # One transaction from the lock to the end (PostgreSQL takes LOCK TABLE only inside one);
    # MariaDB's DDL commits by itself, and its LOCK TABLES holds the writers off instead.
    steps = [_literal(s, dialect) for s in statements]
    begin = {"postgresql": "BEGIN", "sqlite": "BEGIN IMMEDIATE", "mssql": "BEGIN TRANSACTION"}.get(dialect.name)
    return [begin, *steps, "COMMIT"] if begin else steps


def _literal(stmt: sa.Executable, dialect: sa.Dialect) -> str:
    # Every statement here is also a ClauseElement (select, text, DDL); the Executable type has no compile().
    return str(cast(sa.ClauseElement, stmt).compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def convert_ledger(p: TargetPlan, say: Callable[[str], None]) -> int | None:
    """Converts a ledger made by an earlier qbridge in place (None: there was none)."""
    if not p.has_state:
        return None
    return convert(engine_for(p.url), p.schema, p.origins, p.connection, say)


def add_ledger_totals(p: TargetPlan, say: Callable[[str], None]) -> int | None:
    """Adds the per-queue totals beside a ledger an earlier qbridge made without them (None: nothing to do)."""
    if not p.has_state:
        return None
    return add_totals(engine_for(p.url), p.schema, p.connection, say)


def fold_ranges(p: TargetPlan, say: Callable[[str], None]) -> int | None:
    """Folds an earlier ledger's NGinn entries into the range ledger (None: nothing to do)."""
    if not p.has_state:
        return None
    return add_ranges(engine_for(p.url), p.schema, p.origins, p.connection, say)


def group_quarantine(p: TargetPlan, say: Callable[[str], None]) -> int | None:
    """Adds failure groups to a quarantine table an earlier qbridge made (None: nothing to do)."""
    if not p.has_state:
        return None
    return add_groups(engine_for(p.url), p.schema, say)


def totals_upgrade_sql(p: TargetPlan) -> list[str]:
    """For a DBA: the statements that add the totals beside such a ledger."""
    if not p.has_state:
        return []
    dialect = dialect_for(p.url)
    new = totals_table(p.schema, sa.MetaData(), name=TOTALS_NEW)
    return [*create_statements([new], dialect), *_one_transaction(dialect, totals_sql(dialect, p.schema))]


def create_missing(p: TargetPlan) -> tuple[list[str], list[str]]:
    """Creates the tables that do not exist yet, and the indexes an existing one lacks (made by
    an earlier qbridge); returns (created, already there), an index added named as
    `table (index NAME added)` among the latter."""
    engine = engine_for(p.url)
    schema = p.schema
    with engine.begin() as conn:
        insp = sa.inspect(conn)
        if schema and engine.dialect.name != "sqlite" and schema not in insp.get_schema_names():
            raise TargetSchemaError(f"schema {schema!r} does not exist in {p.connection!r}; create it first")
        existing = [t.name for t in p.tables if insp.has_table(t.name, schema=t.schema)]
        created = [n for n in p.names if n not in existing]
        for t in p.tables:
            t.create(conn, checkfirst=True)
            if t.name in existing:
                have = {i["name"] for i in sa.inspect(conn).get_indexes(t.name, schema=t.schema)}
                for index in t.indexes:
                    if index.name not in have:
                        index.create(conn)
                        existing[existing.index(t.name)] = f"{t.name} (index {index.name} added)"
    return created, existing


def sql_for_dba(p: TargetPlan) -> list[str]:
    """`qbridge init --print-sql`: what init would create, and the upgrades of an earlier ledger
    it would run, each with the conditions under which a DBA should run it."""
    sep = "\nGO" if p.backend == "mssql" else ";"
    lines = [f"-- connection {p.connection!r}: {p.label}", *(stmt + sep + "\n" for stmt in ddl(p)), *(n + "\n" for n in notes(p))]
    upgrades = (
        (conversion_sql(p), (f"-- Only where {p.connection!r} has a qbridge_ledger made by qbridge before its (origin, "
                             "source_key) key, and with every qbridge process stopped: convert it (`qbridge init` does "
                             "this itself, after checking that every entry belongs to a queue of this config)")),
        (totals_upgrade_sql(p), (f"-- Only where {p.connection!r} has a qbridge_ledger but no qbridge_totals (made by an "
                                 "earlier qbridge), with every qbridge process stopped: count the ledger once into "
                                 "per-queue totals (`qbridge init` does this itself)")),
        (["-- (no SQL: bits are set in Python)\n"] if p.has_state else [],
         (f"-- Only where {p.connection!r} has a qbridge_ledger but no qbridge_ledger_ranges (made by an earlier qbridge): "
          "`qbridge init` folds the entries of NGinn queues into qbridge_ledger_ranges_new, 10,000 per transaction "
          "(resumable), and renames it into place; every other command refuses the ledger until then")),
    )
    for statements, when in upgrades:
        if statements:
            lines += [when, *(stmt + sep + "\n" for stmt in statements)]
    return lines


def missing_tables(config: Config, job: JobConfig) -> list[str]:
    """What `init` would create for the job, as `connection: table`, read without writing."""
    missing = []
    for p in plan(config, [job]):
        path = sqlite_file(p.url)
        if path is not None and not path.exists():
            missing.append(f"{p.connection}: the database file {path} itself")
        engine = read_only_engine(p.url, missing_ok=True)
        try:
            with engine.connect() as conn:
                insp = sa.inspect(conn)
                missing += [f"{p.connection}: {t.name}" for t in p.tables if not insp.has_table(t.name, schema=t.schema)]
        finally:
            engine.dispose()
    return missing
