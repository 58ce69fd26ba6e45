"""A class-data archive (AppCDS) for Spark's driver JVM, kept in qbridge's cache directory.

Spark's driver loads and verifies a few thousand classes on every start: ~3 s and ~4 s of CPU on
2 cores, beside Python workers that want those cores. Java 13+ can dump the classes a run loaded
into an archive at exit (-XX:ArchiveClassesAtExit) and map them on later starts
(-XX:SharedArchiveFile): start-up 3.0-3.4 s -> 1.6-1.7 s, JVM CPU 4.3-4.8 s -> 2.4-2.6 s on
this project's 2-core machines. The first run on a machine pays once: it starts slower in dump
mode and waits for the dump at exit (~70 MB).

The JVM itself checks that the archive matches its class path and version and runs without it
otherwise; the cache key (java binary, Spark's jars) only avoids keeping a stale one in use.
QBRIDGE_SPARK_CLASS_ARCHIVE=off turns it off; QBRIDGE_CACHE_DIR moves it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("qbridge.migrate")

# Dump mode prints hundreds of "class not supported by CDS" lines; they say nothing to a user.
QUIET = "-Xlog:cds*=off"
STALE_SECONDS = 3600  # a dump left by a killed run (no live run takes that long to exit)
UNUSED_SECONDS = 30 * 86400  # an archive no start has used for this long (an older Java or Spark)


@dataclass(frozen=True)
class ArchivePlan:
    """The JVM options for this start and, in dump mode, where the dump goes and what it becomes."""

    options: str
    dump: Path | None = None
    final: Path | None = None


def cache_dir() -> Path:
    if own := os.environ.get("QBRIDGE_CACHE_DIR"):
        return Path(own)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qbridge"


def java_binary() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(p) if (p := shutil.which("java")) else None)
    return found.resolve() if found is not None and found.exists() else None


def java_feature_version(java: Path) -> int | None:
    """The major version from the JDK's `release` file (no JVM started to ask it)."""
    try:
        text = (java.parent.parent / "release").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0_392" is Java 8


def _key(java: Path, jars: Path, options: str) -> str:
    h = hashlib.sha256()
    for path in (java, jars):
        st = path.stat()
        h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    h.update(options.encode())
    return h.hexdigest()[:16]


def plan(spark_jars: Path, options: str) -> ArchivePlan:
    """How this start uses the archive; ArchivePlan("") when it cannot or should not."""
    if os.environ.get("QBRIDGE_SPARK_CLASS_ARCHIVE", "").lower() in ("off", "0", "false", "no"):
        return ArchivePlan("")
    java = java_binary()
    if java is None or not spark_jars.is_dir() or (java_feature_version(java) or 0) < 13:
        return ArchivePlan("")
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        key = _key(java, spark_jars, options)
        _forget_stale(folder)
    except OSError as e:
        log.debug("no class-data archive for the Spark driver: %s", e)
        return ArchivePlan("")
    final = folder / f"spark-driver-{key}.jsa"
    if final.is_file():
        try:
            os.utime(final)  # in use: not one to forget
        except OSError:
            pass
        return ArchivePlan(f"-XX:SharedArchiveFile={final} {QUIET}")
    dump = folder / f"spark-driver-{key}.{os.getpid()}.partial"
    log.info("first Spark start with this Java and Spark: saving its classes to %s for faster starts later", final)
    return ArchivePlan(f"-XX:ArchiveClassesAtExit={dump} {QUIET}", dump, final)


def keep(archive: ArchivePlan) -> None:
    """After the dumping JVM exited: the complete dump becomes the archive (atomically, so a run
    starting meanwhile sees the whole file or none)."""
    if archive.dump is None or archive.final is None:
        return
    try:
        if archive.dump.is_file() and archive.dump.stat().st_size > 0:
            os.replace(archive.dump, archive.final)
        else:
            archive.dump.unlink(missing_ok=True)
    except OSError as e:
        log.debug("class-data archive not kept: %s", e)


def _forget_stale(folder: Path) -> None:
    now = time.time()
    for pattern, age in (("spark-driver-*.partial", STALE_SECONDS), ("spark-driver-*.jsa", UNUSED_SECONDS)):
        for path in folder.glob(pattern):
            try:
                if now - path.stat().st_mtime > age:
                    path.unlink()
            except OSError:
                pass
