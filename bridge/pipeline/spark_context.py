"""The Spark driver's JVM for `qbridge migrate`: starting it (with the class-data archive and
its stderr relayed), stopping it, and how many task slots a local master has."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge.pipeline import class_archive, logcontext
from bridge.pipeline.cpus import usable_cpus

log = logging.getLogger("qbridge.migrate")

TASK_ATTEMPTS = 4  # spark.task.maxFailures: a task lost with its executor runs again
_LOCAL = re.compile(r"^local(\[(\*|\d+)\])?$")


def spark_context(master: str | None, app: str = "qbridge migrate") -> Any:
    """A SparkContext on `master`; None keeps the master spark-submit was given. The units are an
    RDD: no SparkSession, whose SQL start-up alone took ~2 s of the JVM's start."""
    from pyspark import SparkConf, SparkContext

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if "PYSPARK_GATEWAY_PORT" not in os.environ and not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        from bridge.errors import DriverMissing

        raise DriverMissing("Spark needs a Java runtime (17 or later) and finds none; install one "
                            "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    log4j = Path(__file__).resolve().parent / "spark_conf" / "log4j2.properties"
    # C1 only: the driver JVM schedules tasks and relays rows, a few per cent of the CPU; the C2
    # compiler's warm-up cost more (start 3.7 -> 3.0 s, both cores busy meanwhile).
    java_options = f"-Dlog4j2.configurationFile={log4j.as_uri()} -XX:TieredStopAtLevel=1"
    if _launches_jvm():
        from pyspark.find_spark_home import _find_spark_home

        _jvm["archive"] = class_archive.plan(Path(_find_spark_home()) / "jars", java_options)
        java_options = f"{java_options} {_jvm['archive'].options}".strip()
    conf = SparkConf().setAppName(app).setAll([
        ("spark.task.maxFailures", str(TASK_ATTEMPTS)),
        ("spark.driver.extraJavaOptions", java_options),
        ("spark.ui.showConsoleProgress", "false"),
        ("spark.python.worker.reuse", "true"),
        ("spark.python.daemon.module", "bridge.pipeline.spark_daemon"),
        ("spark.executorEnv.PYTHONHASHSEED", "0"),
        *forwarded_env(os.environ),
        *((f"spark.executorEnv.{n}", v) for n, v in logcontext.executor_env().items()),  # --log-format, for tasks' lines
    ])
    if master is not None:
        slots = local_slots(master)
        # Plain local masters never retry a failed task; give them the same attempts as a cluster.
        conf.setMaster(f"local[{slots},{TASK_ATTEMPTS}]" if slots is not None else master)
    _quiet_gateway(conf)
    return SparkContext.getOrCreate(conf=conf)


# Spark's default redaction (secret|password|token|access.key) plus the OTLP exporter's headers,
# which carry a collector's credentials, from the Spark UI's environment page and event logs.
REDACT = r"(?i)secret|password|token|access[.]key|OTEL_EXPORTER_OTLP_(TRACES_)?HEADERS"


def forwarded_env(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The Spark settings that hand this process's fault points (QBRIDGE_FAULT*) and OpenTelemetry
    exporter (OTEL_*) to the executors' Python workers: on a cluster they do not inherit the
    driver's environment, and a unit would run untraced."""
    forwarded = [(f"spark.executorEnv.{n}", v) for n, v in environ.items() if n.startswith(("QBRIDGE_FAULT", "OTEL_"))]
    if any(n.startswith("OTEL_") for n in environ):
        forwarded.append(("spark.redaction.regex", REDACT))
    return forwarded


# The driver JVM this process launched, and how it uses the class-data archive.
_jvm: dict[str, Any] = {}


def _launches_jvm() -> bool:
    """Whether the next SparkContext starts a driver JVM of its own: not under spark-submit (the
    JVM is there already) nor while this process's earlier one is still up."""
    from pyspark import SparkContext

    return "PYSPARK_GATEWAY_PORT" not in os.environ and SparkContext._gateway is None


def stop_spark(sc: Any) -> None:
    """Stops the SparkContext; a JVM that is dumping its class-data archive is also shut down and
    waited for, so that the archive is complete before it is kept."""
    # PySpark's stop ends with its accumulator server's shutdown, which waits up to a second for
    # the server's connection handler to notice (it polls once a second). qbridge sends no
    # accumulator updates: that server is shut down on its own thread, and the stop returns once
    # the JVM has stopped (~50 ms).
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None and callable(getattr(server, "shutdown", None)):
        sc._accumulatorServer = None
        threading.Thread(target=server.shutdown, name="qbridge-spark-accumulators", daemon=True).start()
    sc.stop()
    archive = _jvm.pop("archive", None)
    gateway = _jvm.get("gateway")
    if archive is None or archive.dump is None or gateway is None:
        return
    from pyspark import SparkContext

    _jvm.pop("gateway")
    gateway.shutdown()
    SparkContext._gateway = SparkContext._jvm = None
    proc = gateway.proc
    try:
        proc.stdin.close()  # the gateway server exits when its stdin closes
        proc.wait(timeout=180)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.debug("the Spark driver JVM did not exit after its class-data dump: %s", e)
        return
    class_archive.keep(archive)


# What the JVM says on every start that a user cannot act on (shown at --log-level DEBUG).
_JVM_CHATTER = re.compile(r"Using incubator modules|Setting default log level to|To adjust logging level use sc\.setLogLevel")
jvm_log = logging.getLogger("qbridge.spark.jvm")


def _quiet_gateway(conf: Any) -> None:
    """Starts the JVM with its stderr relayed line by line: start-up chatter goes to DEBUG, the
    rest (errors, the Python workers' own lines) to our stderr as it was. Under spark-submit the
    JVM is already there, and is left alone."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if not _launches_jvm():
        return
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    _jvm["gateway"] = gateway

    def relay(stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if _JVM_CHATTER.search(line):
                jvm_log.debug("%s", line)
            else:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()

    threading.Thread(target=relay, args=(gateway.proc.stderr,), name="qbridge-jvm-stderr", daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def local_slots(master: str | None) -> int | None:
    """Task slots of a local master, known before Spark starts; None for a cluster. `local[N]`
    gets N and `local` one, as in Spark; `local[*]` gets one more than the CPUs this process can
    use (cpus.usable_cpus: affinity and cgroup quota, as Spark's own `local[*]` counted them): a
    task waits on the databases for part of each batch, and on 2 cores beside a local PostgreSQL
    three tasks left 7-9% of the CPU idle where two left 10-11%, and migrated 1M rows 5-11%
    faster (bench/migrate.py rows, alternated)."""
    m = _LOCAL.match(master or "")
    if m is None:
        return None
    if m.group(2) == "*":
        return usable_cpus() + 1
    return int(m.group(2)) if m.group(2) else 1
