"""`qbridge init` converting a ledger made before it was keyed by (origin, source key).

Earlier ledgers were keyed by the message id, a hash, so every entry landed on a random page of
the key's index. The conversion copies every entry into a ledger of today's layout, each with
the origin of its job's queue (model.queue_origin), and swaps the two, while writers are locked
out: an entry written to the old ledger after it was copied would be lost, and the message
delivered again. Entries of a job or queue the config no longer has cannot be given an origin;
the conversion then changes nothing and names them. Every other command refuses an earlier
ledger (`require_current`) rather than fail on a missing column halfway through a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import sqlalchemy as sa

from bridge.errors import TargetSchemaError
from bridge.ledger.ranges import RANGES
from bridge.ledger.state import LEDGER, LEDGER_COLUMNS, QUARANTINE, ledger_table, state_tables
from bridge.ledger.totals import TOTALS, Totals, totals_table
from bridge.model import message_id_for, queue_origin

NEW, OLD = LEDGER + "_new", LEDGER + "_old"
TOTALS_NEW = TOTALS + "_new"


@dataclass(frozen=True)
class QueueOrigin:
    """One (job, queue) of a config whose ledger entries live in a given database."""

    job: str
    queue: str
    system: str
    database: str  # the source identity the message ids were made with

    @property
    def origin(self) -> int:
        return queue_origin(self.system, self.database, self.queue)


def earlier_layout(conn: sa.Connection, schema: str | None) -> bool:
    """Whether the ledger there exists and predates the origin key."""
    insp = sa.inspect(conn)
    if not insp.has_table(LEDGER, schema=schema):
        return False
    return "origin" not in {c["name"] for c in insp.get_columns(LEDGER, schema=schema)}


def without_totals(conn: sa.Connection, schema: str | None) -> bool:
    """Whether the ledger there exists but the totals beside it (bridge.ledger.totals) do not yet."""
    insp = sa.inspect(conn)
    return insp.has_table(LEDGER, schema=schema) and not insp.has_table(TOTALS, schema=schema)


def without_ranges(conn: sa.Connection, schema: str | None) -> bool:
    """Whether the ledger there exists but the range ledger (bridge.ledger.ranges) beside it does not yet."""
    insp = sa.inspect(conn)
    return insp.has_table(LEDGER, schema=schema) and not insp.has_table(RANGES, schema=schema)


def without_groups(conn: sa.Connection, schema: str | None) -> bool:
    """Whether the quarantine table there exists without its failure-group column (bridge.ledger.failure_groups)."""
    insp = sa.inspect(conn)
    if not insp.has_table(QUARANTINE, schema=schema):
        return False
    return "grp" not in {c["name"].lower() for c in insp.get_columns(QUARANTINE, schema=schema)}


def add_groups(engine: sa.Engine, schema: str | None, say: Callable[[str], None]) -> int | None:
    """Adds the failure-group column to a quarantine table an earlier qbridge made and fills it,
    1,000 rows a transaction (a run cut off goes on where it stopped); None: nothing to do.
    Its index is added by `init` afterwards, as any index an existing table lacks."""
    from bridge.ledger.failure_groups import group_of

    q = state_tables(schema)["quarantine"]
    with engine.begin() as conn:
        if not sa.inspect(conn).has_table(QUARANTINE, schema=schema):
            return None
        if without_groups(conn, schema):
            column = q.c.grp.type.compile(dialect=conn.dialect)
            conn.execute(sa.text(f"ALTER TABLE {conn.dialect.identifier_preparer.format_table(q)} ADD grp {column}"))
    done = 0
    while True:
        with engine.begin() as conn:
            rows = conn.execute(sa.select(q.c.message_id, q.c.job, q.c.queue, q.c.reason).where(q.c.grp.is_(None))
                                .limit(1000)).all()
            for mid, job, queue, reason in rows:
                conn.execute(sa.update(q).where(q.c.message_id == mid).values(grp=group_of(job, queue, reason)))
        done += len(rows)
        if len(rows) < 1000:
            break
        say(f"grouped {done:,} quarantined messages ...")
    return done or None


def require_current(conn: sa.Connection, schema: str | None, connection: str) -> None:
    where = f"{schema}.{LEDGER}" if schema else LEDGER
    if earlier_layout(conn, schema):
        raise TargetSchemaError(
            f"the ledger {where!r} in {connection!r} was made by an earlier qbridge (keyed by message id); "
            "stop every qbridge process using it and run `qbridge init -c CONFIG` once to convert it")
    if without_totals(conn, schema):
        raise TargetSchemaError(
            f"the ledger {where!r} in {connection!r} has no per-queue totals beside it (made by an earlier qbridge); "
            "stop every qbridge process using it and run `qbridge init -c CONFIG` once to add them (it counts the ledger once)")
    if without_ranges(conn, schema):
        raise TargetSchemaError(
            f"the ledger {where!r} in {connection!r} keeps every NGinn message as an entry (made by an earlier qbridge); "
            "stop every qbridge process using it and run `qbridge init -c CONFIG` once to fold them into ranges "
            "(qbridge_ledger_ranges; a fold cut off resumes on the next init)")
    if without_groups(conn, schema):
        raise TargetSchemaError(
            f"the quarantine table beside {where!r} in {connection!r} has no failure groups (made by an earlier qbridge); "
            "run `qbridge init -c CONFIG` once to add them (it groups the messages quarantined so far)")


def totals_sql(dialect: sa.Dialect, schema: str | None) -> list[sa.Executable]:
    """The ledger counted once into `qbridge_totals_new` (already created), then renamed into
    place: a cut-off run leaves only the `_new` table, which the next one starts again. Writers
    of this qbridge refuse to run until `qbridge_totals` is there; the ledger is locked against
    earlier ones while it is counted."""
    md = sa.MetaData()
    new = totals_table(schema, md, name=TOTALS_NEW)
    q_ledger, q_new = _name(dialect, schema, LEDGER), _name(dialect, schema, TOTALS_NEW)
    steps: list[sa.Executable] = []
    if dialect.name == "postgresql":
        steps.append(sa.text(f"LOCK TABLE {q_ledger} IN SHARE MODE"))
    mysql = dialect.name in ("mysql", "mariadb")
    if mysql:
        steps.append(sa.text(f"LOCK TABLES {q_ledger} READ, {q_new} WRITE"))
    steps.append(Totals(new).seed(ledger_table(schema, md)))
    if mysql:
        steps.append(sa.text("UNLOCK TABLES"))
    steps.append(rename_sql(dialect, schema, TOTALS_NEW, TOTALS))
    return steps


def add_totals(engine: sa.Engine, schema: str | None, connection: str, say: Callable[[str], None] = lambda _: None) -> int | None:
    """Adds the totals beside a ledger that has none; returns how many entries it counted (None: nothing to do)."""
    new = totals_table(schema, sa.MetaData(), name=TOTALS_NEW)
    with engine.connect() as conn:
        with conn.begin():
            if not without_totals(conn, schema) or earlier_layout(conn, schema):
                return None
            n = conn.execute(sa.select(sa.func.count()).select_from(ledger_table(schema, sa.MetaData()))).scalar_one()
        say(f"{connection}: counting the ledger's {n:,} entries into per-queue totals")
        with conn.begin():
            new.drop(conn, checkfirst=True)  # a run cut off before its rename
            new.create(conn)
        steps = totals_sql(engine.dialect, schema)
        try:
            with conn.begin():
                for step in steps:
                    conn.execute(step)
        except BaseException:
            if engine.dialect.name in ("mysql", "mariadb"):
                conn.execute(sa.text("UNLOCK TABLES"))
            raise
    return int(n)


def _old(schema: str | None) -> sa.TableClause:
    return sa.table(LEDGER, *(sa.column(c) for c in LEDGER_COLUMNS if c != "origin"), schema=schema)


class Group(NamedTuple):
    """The old ledger's entries of one (job, queue), with one of them to check its message id by."""

    job: str
    queue: str
    entries: int
    key: str
    message_id: str


def _groups(conn: sa.Connection, schema: str | None) -> list[Group]:
    old = _old(schema)
    groups = conn.execute(sa.select(old.c.job, old.c.queue, sa.func.count(), sa.func.min(old.c.source_key))
                          .group_by(old.c.job, old.c.queue).order_by(old.c.job, old.c.queue)).all()
    out = []
    for job, queue, n, key in groups:
        mid = conn.execute(sa.select(old.c.message_id).where(old.c.job == job, old.c.queue == queue, old.c.source_key == key)
                           .limit(1)).scalar_one()
        out.append(Group(job, queue, int(n), key, mid))
    return out


def _check(groups: list[Group], origins: dict[tuple[str, str], QueueOrigin], connection: str) -> None:
    problems = []
    for g in groups:
        o = origins.get((g.job, g.queue))
        if o is None:
            problems.append(f"{g.entries} entries of job {g.job!r} queue {g.queue!r}, which this config does not have: "
                            "put that job and queue back in the config (its source as it was) and run init again")
        elif str(message_id_for(o.system, o.database, g.queue, g.key)) != g.message_id:
            problems.append(f"{g.entries} entries of job {g.job!r} queue {g.queue!r} were made under another source identity "
                            f"than today's {o.database!r} (key {g.key!r} has message id {g.message_id}): set "
                            "jobs[].source.database to the one they were made with and run init again")
    if problems:
        raise TargetSchemaError(f"{connection!r}: the ledger made by an earlier qbridge cannot be converted, "
                                "nothing was changed:\n  " + "\n  ".join(problems))


@dataclass
class Conversion:
    """The statements of a conversion, in three parts: writers locked out, the old ledger copied
    into `qbridge_ledger_new` (already created), the two swapped. One transaction where the
    database has transactional DDL; MariaDB renames a locked table only with ALTER TABLE."""

    lock: list[sa.Executable]
    copy: list[sa.Executable]
    swap: list[sa.Executable]  # ends with `release`, then drops the old ledger
    release: list[sa.Executable]  # what lets the writers in again when the conversion stops halfway

    @property
    def statements(self) -> list[sa.Executable]:
        return [*self.lock, *self.copy, *self.swap]


def _name(dialect: sa.Dialect, schema: str | None, table: str) -> str:
    return dialect.identifier_preparer.format_table(sa.table(table, schema=schema))


def rename_sql(dialect: sa.Dialect, schema: str | None, table: str, to: str) -> sa.TextClause:
    if dialect.name == "mssql":
        prefix = f"{schema}." if schema else ""
        return sa.text(f"EXEC sp_rename N'{prefix}{table}', N'{to}'")
    return sa.text(f"ALTER TABLE {_name(dialect, schema, table)} RENAME TO {dialect.identifier_preparer.quote(to)}")


def conversion(dialect: sa.Dialect, schema: str | None, origins: list[QueueOrigin]) -> Conversion:
    old, new = _old(schema), ledger_table(schema, name=NEW)
    q_old, q_new, q_renamed = _name(dialect, schema, LEDGER), _name(dialect, schema, NEW), _name(dialect, schema, OLD)
    name = dialect.name
    mysql = name in ("mysql", "mariadb")
    lock: list[sa.Executable] = []
    if name == "postgresql":
        lock.append(sa.text(f"LOCK TABLE {q_old} IN EXCLUSIVE MODE"))
    elif mysql:
        lock.append(sa.text(f"LOCK TABLES {q_old} WRITE, {q_new} WRITE"))
    cols = [c for c in LEDGER_COLUMNS if c != "origin"]
    copy: list[sa.Executable] = []
    for o in origins:
        select = sa.select(sa.literal(o.origin, sa.BigInteger()), *(old.c[c] for c in cols)).where(
            old.c.job == o.job, old.c.queue == o.queue)
        if name == "mssql":
            select = select.with_hint(old, "WITH (TABLOCKX, HOLDLOCK)", "mssql")
        copy.append(sa.insert(new).from_select(["origin", *cols], select))
    # Renamed into place rather than created under the final name: PostgreSQL's and SQL
    # Server's index names are per schema, and the old key's index still holds the name.
    swap: list[sa.Executable] = [rename_sql(dialect, schema, LEDGER, OLD), rename_sql(dialect, schema, NEW, LEDGER)]
    release: list[sa.Executable] = [sa.text("UNLOCK TABLES")] if mysql else []
    swap += [*release, sa.text(f"DROP TABLE {q_renamed}")]
    return Conversion(lock, copy, swap, release)


def _resume(conn: sa.Connection, schema: str | None) -> None:
    """Finishes a MariaDB conversion cut off between its statements (DDL commits there one by
    one): the old ledger renamed aside but the new one not yet in place, or not yet dropped.
    The new one was counted complete before the first rename."""
    def has(table: str) -> bool:
        return sa.inspect(conn).has_table(table, schema=schema)

    d = conn.dialect
    quote = d.identifier_preparer.quote
    with conn.begin():
        if not has(LEDGER) and has(OLD):
            back = NEW if has(NEW) else OLD
            conn.execute(sa.text(f"ALTER TABLE {_name(d, schema, back)} RENAME TO {quote(LEDGER)}"))
        if has(OLD) and not earlier_layout(conn, schema):
            conn.execute(sa.text(f"DROP TABLE {_name(d, schema, OLD)}"))


def convert(engine: sa.Engine, schema: str | None, origins: list[QueueOrigin], connection: str,
            say: Callable[[str], None] = lambda _: None) -> int | None:
    """Converts an earlier ledger there; returns how many entries moved (None: nothing to convert)."""
    with engine.connect() as conn:
        _resume(conn, schema)
        with conn.begin():
            if not earlier_layout(conn, schema):
                return None
            groups = _groups(conn, schema)
        by_pair = {(o.job, o.queue): o for o in origins}
        _check(groups, by_pair, connection)
        total = sum(g.entries for g in groups)
        used = [by_pair[(g.job, g.queue)] for g in groups]
        new = ledger_table(schema, name=NEW)
        with conn.begin():
            new.drop(conn, checkfirst=True)  # a conversion cut off before its swap
            new.create(conn)
        say(f"{connection}: converting the ledger ({total:,} entries of {len(used)} queue(s)) to the (origin, source key) layout")
        steps = conversion(engine.dialect, schema, used)
        try:
            with conn.begin():
                for step in [*steps.lock, *steps.copy]:
                    conn.execute(step)
                _same_count(conn, schema, total)
                for step in steps.swap:
                    conn.execute(step)
        except BaseException:
            for step in steps.release:
                conn.execute(step)
            raise
    return total


def _same_count(conn: sa.Connection, schema: str | None, expected: int) -> None:
    """Before the swap: every entry of the old ledger is in the new one (a writer that was not
    locked out would show here, and the conversion stops with nothing swapped)."""
    old = conn.execute(sa.select(sa.func.count()).select_from(_old(schema))).scalar_one()
    new = conn.execute(sa.select(sa.func.count()).select_from(ledger_table(schema, name=NEW))).scalar_one()
    if not old == new == expected:
        raise TargetSchemaError(f"the ledger changed while it was converted ({expected} entries counted, {old} there now, "
                                f"{new} copied): stop every qbridge process using this database and run init again")
