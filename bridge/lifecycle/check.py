"""`qbridge check` (issue 48): every statement a job runs, run once on its own connections before
the first message moves, each in a transaction that is rolled back.

Each probe calls the code the pipeline calls (the source's reads, locking read and consume, the
target's write, the books' record, the checkpoint lock, the fence, the job lock, the transport's
receive), never a list of SQL of its own; what it ran is recorded as the database ran it and as
SQL Server would (compiled by the mssql dialect: the statements the SQL Server tests compile).
A probe that fails says what the database said and what fixes it: the GRANT for the login, the
`init` step, the setting. Nothing stays behind: no row, no table, no lock (identity counters a
rolled-back insert advanced excepted, as every database keeps them).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from bridge.config import Config
from bridge.db import engine_for, sqlite_file
from bridge.timefmt import utcnow

# Text outside Latin-1 and a character outside the Basic Multilingual Plane (4 bytes in UTF-8):
# a varchar column, a legacy collation or a utf8mb3 table changes or refuses it.
PROBE_TEXT = "Zażółć gęślą jaźń · 東京 · 𝄞"
CHECK_JOB = "(qbridge check)"  # a job no config names (names take no parentheses): rows a probe addresses by it are none
CLOCK_SKEW = 5.0  # seconds a database's clock may differ from this host's before the check fails


@dataclass
class Probe:
    """One thing checked: where, what, whether it held, what the database said, what fixes it."""

    job: str
    side: str  # "connection <name>", "source", "target"
    what: str
    ok: bool
    said: str
    fix: str = ""
    statements: list[str] = field(default_factory=list)  # as run here
    mssql: list[str] = field(default_factory=list)  # the same, compiled for SQL Server

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Need:
    """A right a probe needs: `privilege` on `table` (a sa.Table) of connection `url`."""

    privilege: str
    table: sa.Table


class Recorder:
    """The statements run on an engine while a probe runs (Core constructs, as executed)."""

    def __init__(self) -> None:
        self.clauses: list[Any] = []
        self.extra_mssql: list[str] = []

    def __call__(self, conn: Any, clause: Any, *args: Any, **kw: Any) -> None:
        self.clauses.append((conn.dialect, clause))

    def texts(self) -> tuple[list[str], list[str]]:
        here, mssql = [], list(self.extra_mssql)
        from sqlalchemy.dialects import mssql as mssql_dialect

        for dialect, clause in self.clauses:
            text = _compiled(clause, dialect)
            if text and text not in here:
                here.append(text)
            other = _compiled(clause, mssql_dialect.dialect())
            if other and other not in mssql:
                mssql.append(other)
        return here, mssql


def _compiled(clause: Any, dialect: Any) -> str | None:
    try:
        return " ".join(str(clause.compile(dialect=dialect)).split())
    except Exception:  # noqa: BLE001 - a construct one dialect cannot spell (a PostgreSQL array) is listed where it runs
        return None


@contextmanager
def recording(*engines: sa.Engine) -> Iterator[Recorder]:
    rec = Recorder()
    for e in dict.fromkeys(engines):
        sa.event.listen(e, "before_execute", rec)
    try:
        yield rec
    finally:
        for e in dict.fromkeys(engines):
            sa.event.remove(e, "before_execute", rec)


class Checker:
    """The probes of one run of `qbridge check`."""

    def __init__(self, config: Config, config_path: str) -> None:
        self.config = config
        self.config_path = config_path
        self.probes: list[Probe] = []
        self._logins: dict[str, str] = {}

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.probes)

    def run(self, job: str, side: str, what: str, engines: tuple[sa.Engine, ...], body: Callable[[Recorder], str],
            needs: Callable[[], list[tuple[str, Need]]] | None = None) -> Probe:
        """Runs `body` (which opens its transactions on `engines` and rolls them back) and keeps its probe."""
        with recording(*engines) as rec:
            try:
                said, ok, fix = body(rec), True, ""
            except Exception as e:  # noqa: BLE001 - every failure is the probe's result, said with its fix
                said, ok = _said(e), False
                fix = self.fix_for(e, needs() if needs else [])
        here, mssql = rec.texts()
        probe = Probe(job, side, what, ok, said, fix, here, mssql)
        self.probes.append(probe)
        return probe

    def fix_for(self, e: Exception, needs: list[tuple[str, Need]]) -> str:
        """What fixes `e`: the GRANTs of the rights the probe needs, `init`, or the database's words."""
        text = _said(e)
        if DENIED.search(text):
            named = [(url, n) for url, n in needs if re.search(rf"\b{re.escape(n.table.name)}\b", text)] or needs
            grants = [self.grant(url, n) for url, n in named]
            return " ".join(dict.fromkeys(grants)) or "grant the login the rights docs/moving-a-queue.md lists"
        if _MISSING.search(text):
            if "qbridge_" in text or "proxy queue" in text or "run `qbridge init`" in text:
                return f"run `qbridge init -c {self.config_path}` (or `qbridge init --print-sql` for a DBA)"
            return "the table is not where the config says: check the connection's database and the job's schema"
        if "read-only" in text.lower() or "readonly" in text.lower():
            sqlite = [sqlite_file(url) for url, _ in needs if sqlite_file(url) is not None]
            return f"make {sqlite[0]} writable by this user" if sqlite else "connect with a login that may write"
        return "fix the database or the connection named above"

    def grant(self, url: str, need: Need) -> str:
        """The GRANT of `need` for the login of `url`, in its database's own words."""
        path = sqlite_file(url)
        if path is not None:
            return f"make {path} writable by this user" if need.privilege != "SELECT" else f"make {path} readable by this user"
        engine = engine_for(url)  # the job's own engine: its pool, not one of the check's
        quoted = engine.dialect.identifier_preparer.format_table(need.table)
        return f"GRANT {need.privilege} ON {quoted} TO {self._login(url, engine)};"

    def _login(self, url: str, engine: sa.Engine) -> str:
        found = self._logins.get(url)
        if found is None:
            query = {"postgresql": "SELECT current_user", "mysql": "SELECT CURRENT_USER()", "mariadb": "SELECT CURRENT_USER()",
                     "mssql": "SELECT USER_NAME()"}.get(engine.dialect.name, "SELECT current_user")
            with engine.connect() as conn:
                who = str(conn.execute(sa.text(query)).scalar())
            if engine.dialect.name in ("mysql", "mariadb") and "@" in who:
                user, host = who.rsplit("@", 1)
                who = f"'{user}'@'{host}'"
            elif engine.dialect.name == "mssql":
                who = f"[{who}]"
            else:
                who = engine.dialect.identifier_preparer.quote(who)
            found = self._logins[url] = who
        return found


DENIED = re.compile(r"permission denied|permission was denied|command denied|access denied|insufficient privilege|"
                     r"not authorized|attempt to write a readonly database|readonly database", re.IGNORECASE)
_MISSING = re.compile(r"does not exist|doesn't exist|no such table|not found|invalid object name|run `qbridge init`", re.IGNORECASE)


def _said(e: BaseException) -> str:
    """The database's own words (the driver's first line), else the error's."""
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e)
    return " ".join(text.split("\n")[0].split()) or type(e).__name__


def clock_of(conn: sa.Connection) -> tuple[float | None, str]:
    """(the database's UTC clock minus this host's, in seconds; its session time zone), None for
    a database on this host's own clock (SQLite)."""
    name = conn.dialect.name
    if name == "sqlite":
        return None, "this host's (SQLite)"
    query = {"postgresql": "SELECT now(), current_setting('TimeZone')",
             "mssql": "SELECT SYSUTCDATETIME(), DATENAME(TZOFFSET, SYSDATETIMEOFFSET())"}.get(
        name, "SELECT UTC_TIMESTAMP(6), @@session.time_zone")
    before = time.time()
    db_now, zone = conn.execute(sa.text(query)).one()
    host = utcnow().timestamp() - (time.time() - before) / 2
    if db_now.tzinfo is None:
        from datetime import UTC

        db_now = db_now.replace(tzinfo=UTC)
    return db_now.timestamp() - host, str(zone)


@contextmanager
def rolled_back(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction that is rolled back whatever happens."""
    with engine.connect() as conn:
        tx = conn.begin()
        try:
            yield conn
        finally:
            tx.rollback()


def tables_of(side: Any) -> list[sa.Table]:
    """The tables a source or a legacy target holds (as attributes, or in a dict of them), for
    the GRANTs a failure names and the engines a probe looks at."""
    found: list[sa.Table] = []
    for value in (getattr(side, name, None) for name in getattr(side, "__slots__", ()) or vars(side)):
        if isinstance(value, sa.Table):
            found.append(value)
        elif isinstance(value, dict):
            found += [t for t in value.values() if isinstance(t, sa.Table)]
    return list(dict.fromkeys(found))
