"""The probes of `qbridge check` (bridge.lifecycle.check): a job's connections, its source and its
target, each through the code the pipeline runs, each in a transaction that is rolled back."""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa

from bridge.config import Config
from bridge.db import sqlite_file
from bridge.lifecycle.check import CLOCK_SKEW, Checker, Need, Recorder, clock_of, rolled_back, tables_of
from bridge.lifecycle.check_target import target_probes
from bridge.pipeline.loop import JobRunner


def check(config: Config, runners: list[JobRunner], config_path: str) -> Checker:
    """Every probe of every job of `runners`."""
    checker = Checker(config, config_path)
    seen: set[str] = set()
    for runner in runners:
        sides = {"source": (runner.job.source.connection, runner.source_url, runner.source_engine),
                 "target": (runner.job.target.connection, runner.target_url, runner.target_engine)}
        absent = {side for side, (_, url, _) in sides.items() if _missing_file(url)}
        for side, (name, url, engine) in sides.items():
            if name in seen:
                continue
            seen.add(name)
            if side in absent:  # opening it would make an empty file: said (a target's by its tables probe), not opened
                if side == "source":
                    checker.run(runner.job.name, f"connection {name}", "database file", (), _no_file(url, side))
            else:
                connection_probes(checker, runner, name, url, engine)
        if "source" not in absent:
            unwritable = transactions_probe(checker, runner)
            source_probes(checker, runner, unwritable)
        else:
            unwritable = set()
        target_probes(checker, runner, unwritable, opened="target" not in absent)
    return checker


def _missing_file(url: str) -> bool:
    path = sqlite_file(url)
    return path is not None and not path.exists()


def _no_file(url: str, side: str) -> Any:
    def body(rec: Recorder) -> str:
        raise MissingFile(f"no SQLite database at {sqlite_file(url)}"
                          + ("; `qbridge init` makes the target's" if side == "target" else "; check the connection's path"))
    return body


class MissingFile(Exception):
    pass


def connection_probes(checker: Checker, runner: JobRunner, name: str, url: str, engine: sa.Engine) -> None:
    job = runner.job.name

    def server(rec: Recorder) -> str:
        with engine.connect() as conn:
            version = ".".join(map(str, conn.dialect.server_version_info or ())) or "?"
            return f"{conn.dialect.name} {version} through {engine.url.drivername}"

    def clock(rec: Recorder) -> str:
        with engine.connect() as conn:
            skew, zone = clock_of(conn)
        if skew is None:
            return f"clock: {zone}"
        if abs(skew) > CLOCK_SKEW:
            raise ClockSkew(f"its clock is {skew:+.1f} s from this host's (session time zone {zone}); due times, expiries "
                            f"and late_commit_window are read on both")
        return f"clock within {abs(skew):.1f} s of this host's; session time zone {zone}"

    side = f"connection {name}"
    checker.run(job, side, "server", (), server)
    probe = checker.run(job, side, "clock", (), clock)
    if not probe.ok and isinstance(probe.said, str) and probe.said.startswith("its clock"):
        probe.fix = "set the database server's clock (NTP) or this host's"


class ClockSkew(Exception):
    pass


def transactions_probe(checker: Checker, runner: JobRunner) -> set[str]:
    """On MariaDB/MySQL, the engine of each table the job changes there (a move-mode source's, a
    reverse job's legacy target and books): one without transactions (MyISAM, Aria, MEMORY) keeps a
    rolled-back change, which breaks exactly once, and a probe must not write into it. Returns
    the names of such tables."""
    changed: list[tuple[sa.Engine, str, sa.Table]] = []
    if runner.job.mode == "move" or runner.job.reverse:
        changed += [(runner.source_engine, runner.source_url, t) for src in runner.sources.values() for t in tables_of(src)]
    if runner.job.reverse:
        changed += [(runner.target_engine, runner.target_url, t) for t in [*tables_of(runner.target), *runner.state.all_tables()]]
    mysql = [(e, u, t) for e, u, t in changed if e.dialect.name in ("mysql", "mariadb")]
    bad: set[str] = set()
    if not mysql:
        return bad

    def engines(rec: Recorder) -> str:
        found: dict[str, str] = {}
        for engine in dict.fromkeys(e for e, _, _ in mysql):
            names = [t.name for e, _, t in mysql if e is engine]
            with rolled_back(engine) as conn:
                found.update((str(n), str(e)) for n, e in conn.execute(sa.text(
                    "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                    "AND TABLE_NAME IN :names").bindparams(sa.bindparam("names", expanding=True)), {"names": names}).all())
        plain = {n: e for n, e in found.items() if (e or "").lower() not in ("innodb", "xtradb", "ndbcluster", "rocksdb")}
        bad.update(plain)
        if plain:
            raise NoTransactions(", ".join(f"{n} is {e}" for n, e in sorted(plain.items()))
                                 + ": a table without transactions keeps what a rolled-back transaction wrote, and exactly "
                                 "once needs the write and the books to commit together; the probes that would change it are not run")
        return f"the tables the job changes keep transactions ({', '.join(sorted(set(found.values())))})"

    probe = checker.run(runner.job.name, "source", "transactions", (), engines)
    if not probe.ok and bad:
        probe.fix = " ".join(f"ALTER TABLE `{n}` ENGINE=InnoDB;" for n in sorted(bad))
    return bad


class NoTransactions(Exception):
    pass


def source_probes(checker: Checker, runner: JobRunner, unwritable: Collection[str] = ()) -> None:
    job, engine, url = runner.job.name, runner.source_engine, runner.source_url
    move = runner.job.mode == "move"
    for queue, source in runner.sources.items():

        def needs(privilege: str, src: Any = source) -> Any:
            return lambda: [(url, Need(privilege, t)) for t in tables_of(src)]

        def schema(rec: Recorder, src: Any = source) -> str:
            with rolled_back(engine) as conn:
                src.check_schema(conn)
            return "the tables and columns are there"

        if not checker.run(job, "source", f"{queue}: schema", (engine,), schema, needs("SELECT")).ok:
            continue
        rows: list[Any] = []

        def read(rec: Recorder, src: Any = source, rows: list[Any] = rows) -> str:
            rows[:] = _first_batch(runner, src)
            return f"the batch read returned {len(rows)} row(s)" + (" (the queue is empty)" if not rows else "")

        checker.run(job, "source", f"{queue}: batch read", (engine,), read, needs("SELECT"))
        if move or runner.job.reverse:
            def locking(rec: Recorder, src: Any = source, rows: list[Any] = rows) -> str:
                with rolled_back(engine) as conn:
                    if src.cursor == "scan":
                        got = src.fetch_keys(conn, [r.key for r in rows[:1]], True)
                    else:
                        got = src.fetch_after(conn, None, 1, True)
                    return f"the locking read took {len(got)} row(s), let go at once"

            def consume(rec: Recorder, src: Any = source) -> str:
                if any(t.name in unwritable for t in tables_of(src)):
                    return "not run: a table it changes keeps no transactions (see transactions)"
                with rolled_back(engine) as conn:  # a key no row has: the statements run, no row changes
                    src.consume(conn, _absent_key(src))
                return "the consume ran for a key no row has (no row changed) and was rolled back"

            privilege = "UPDATE" if source.system == "nginn" else "DELETE"
            checker.run(job, "source", f"{queue}: locking read", (engine,), locking, needs("UPDATE"))
            checker.run(job, "source", f"{queue}: consume", (engine,), consume, needs(privilege))


def _absent_key(source: Any) -> list[Any]:
    """A key of the source's own shape that no row has."""
    zero = "00000000-0000-0000-0000-000000000000"
    keys: dict[str, list[Any]] = {"nginn": [-1], "nservicebus": ["q:-1"], "openjms": ["ID:qbridge-check#-1"],
            "biztalk": [f"Q:{zero}:{zero}", f"S:{zero}:{zero}"]}
    return keys.get(source.system, [])


def _first_batch(runner: JobRunner, source: Any) -> list[Any]:
    keys: list[Any] = []
    if source.cursor == "scan":  # the keys first, on a connection of their own (a stream), as a pass reads them
        with rolled_back(runner.source_engine) as kconn:
            keys = list(itertools.islice(source.iter_keys(kconn), runner.job.batch_size))
    with rolled_back(runner.source_engine) as conn:
        if source.cursor == "monotonic":
            return list(source.fetch_after(conn, None, runner.job.batch_size, False))
        if source.cursor == "scan":
            return list(source.fetch_keys(conn, keys, False)) if keys else []
        return list(source.fetch_after(conn, None, 1, True))


