"""The Python worker daemon of `qbridge migrate`'s Spark tasks: PySpark's own (`pyspark.daemon`,
named by `spark.python.daemon.module`), importing PySpark from its installed package.

Spark puts `python/lib/pyspark.zip` and its py4j zip first on the workers' path, and Python
compiles every module it imports from a zip afresh (zipimport keeps no bytecode cache): the
daemon's start and each worker's first task compiled PySpark's sources, ~0.6 s before the first
unit could run (a first job of 1.3 s, 0.75 s without). When those zips are the ones shipped
inside the installed pyspark package (a pip-installed PySpark, whose own requirements pin a
compatible py4j), the installed packages, with their compiled bytecode, come first instead. A
Spark installation of its own (a cluster's `SPARK_HOME`) keeps its zips first."""

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

if __name__ == "__main__":
    daemon.manager()
