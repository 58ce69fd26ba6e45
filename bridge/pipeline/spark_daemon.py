"""The Python worker daemon of `qbridge migrate`'s Spark tasks: PySpark's own (`pyspark.daemon`,
named by `spark.python.daemon.module`), importing PySpark from its installed package.

Spark puts `python/lib/pyspark.zip` and its py4j zip first on the workers' path, and Python
compiles every module it imports from a zip afresh (zipimport keeps no bytecode cache): the
daemon's start and each worker's first task compiled PySpark's sources, ~0.6 s before the first
unit could run (a first job of 1.3 s, 0.75 s without). When those zips are the ones shipped
inside the installed pyspark package (a pip-installed PySpark, whose own requirements pin a
compatible py4j), the installed packages, with their compiled bytecode, come first instead. A
Spark installation of its own (a cluster's `SPARK_HOME`) keeps its zips first.

The daemon forks each Python worker, and each worker imported qbridge's task code (the config,
the engine, SQLAlchemy, psycopg, Arrow, the lane) on its first task: on 2 cores with three task
slots that was ~0.9 s of CPU a worker, 11% of a 500k-row migration's Python (py-spy). Imported
once here, before the first fork, every worker has them already (their pages shared until
written). Not Arrow: its bundled jemalloc starts a thread of its own when loaded, and a fork beside
an allocator's thread is where jemalloc has deadlocked; it is 0.05 s of a worker's ~0.6 s."""

from __future__ import annotations

import importlib.machinery
import os
import sys


def installed_pyspark_first(path: list[str]) -> list[str]:
    """`path` with PySpark's zips moved behind the rest when they lie inside the pyspark package
    that the rest of `path` holds; `path` itself otherwise."""
    zips = [p for p in path if p.endswith(".zip") and os.path.basename(p).startswith(("pyspark", "py4j"))]
    if not zips:
        return path
    rest = [p for p in path if p not in zips]
    installed = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if installed is None or installed.origin is None:
        return path
    package = os.path.realpath(os.path.dirname(installed.origin)) + os.sep
    if not all(os.path.realpath(z).startswith(package) for z in zips):
        return path
    return rest + zips


sys.path[:] = installed_pyspark_first(sys.path)

from pyspark import daemon


def preload() -> None:
    """Imports what a unit's task runs, before the workers are forked; where an import fails the
    worker meets the error itself on its task, where Spark reports it."""
    try:
        import psycopg  # noqa: F401 - SQLAlchemy's dialect imports it when a task makes its engine

        import bridge.pipeline.spark  # noqa: F401 - the task's own module: CloudPickle imports it in each worker
    except Exception:  # noqa: BLE001, S110 - reported by the worker that needs it
        pass


if __name__ == "__main__":
    preload()
    daemon.manager()
