"""The Spark driver's class-data archive: made once by a real JVM, used by the next start, never
half-kept, and switched off on request or where the Java cannot do it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.pipeline import class_archive
from tests.pipeline.test_spark_migrate import _java


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("QBRIDGE_CACHE_DIR", str(folder))
    monkeypatch.delenv("QBRIDGE_SPARK_CLASS_ARCHIVE", raising=False)
    return folder


def _jars(tmp_path: Path) -> Path:
    jars = tmp_path / "jars"
    jars.mkdir(exist_ok=True)
    return jars


def test_first_plan_dumps_then_keep_makes_the_archive_that_later_plans_use(cache: Path, tmp_path: Path) -> None:
    _java()
    first = class_archive.plan(_jars(tmp_path), "-Dx=1")
    assert first.dump is not None and first.final is not None
    assert f"-XX:ArchiveClassesAtExit={first.dump}" in first.options and "-Xlog:cds*=off" in first.options
    first.dump.write_bytes(b"archive")
    class_archive.keep(first)
    assert first.final.read_bytes() == b"archive" and not first.dump.exists()
    again = class_archive.plan(_jars(tmp_path), "-Dx=1")
    assert again.dump is None and again.options.startswith(f"-XX:SharedArchiveFile={first.final} ")
    # Other JVM options make another archive.
    assert class_archive.plan(_jars(tmp_path), "-Dx=2").dump is not None


def test_an_empty_or_missing_dump_is_not_kept(cache: Path, tmp_path: Path) -> None:
    _java()
    plan = class_archive.plan(_jars(tmp_path), "")
    assert plan.dump is not None and plan.final is not None
    plan.dump.write_bytes(b"")
    class_archive.keep(plan)
    assert not plan.final.exists() and not plan.dump.exists()
    class_archive.keep(plan)  # nothing there at all: still nothing kept, no error
    assert not plan.final.exists()


def test_a_partial_dump_left_by_a_killed_run_and_an_unused_archive_are_removed_once_stale(cache: Path, tmp_path: Path
                                                                                          ) -> None:
    _java()
    cache.mkdir(parents=True)
    old, fresh = cache / "spark-driver-0.1.partial", cache / "spark-driver-0.2.partial"
    unused, recent = cache / "spark-driver-0.jsa", cache / "spark-driver-1.jsa"
    for f in (old, fresh, unused, recent):
        f.write_bytes(b"x")
    for f, age in ((old, class_archive.STALE_SECONDS), (unused, class_archive.UNUSED_SECONDS),
                   (recent, class_archive.STALE_SECONDS)):
        os.utime(f, (time.time() - age - 60,) * 2)
    class_archive.plan(_jars(tmp_path), "")
    assert not old.exists() and fresh.exists() and not unused.exists() and recent.exists()


def test_using_an_archive_marks_it_as_used(cache: Path, tmp_path: Path) -> None:
    _java()
    made = class_archive.plan(_jars(tmp_path), "")
    assert made.dump is not None and made.final is not None
    made.final.write_bytes(b"archive")
    os.utime(made.final, (time.time() - class_archive.UNUSED_SECONDS + 3600,) * 2)
    class_archive.plan(_jars(tmp_path), "")
    assert time.time() - made.final.stat().st_mtime < 600


def test_switched_off_or_without_spark_jars_there_is_no_archive(cache: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert class_archive.plan(tmp_path / "no-such-jars", "").options == ""
    monkeypatch.setenv("QBRIDGE_SPARK_CLASS_ARCHIVE", "off")
    assert class_archive.plan(_jars(tmp_path), "") == class_archive.ArchivePlan("")
    assert not cache.exists()


@pytest.mark.parametrize(("release", "version"), [
    ('JAVA_VERSION="17.0.15"', 17), ('JAVA_VERSION="1.8.0_392"', 8), ('JAVA_VERSION="21"', 21), ("nothing", None)])
def test_java_version_is_read_from_the_release_file(tmp_path: Path, release: str, version: int | None) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "release").write_text(f'IMPLEMENTOR="x"\n{release}\n')
    assert class_archive.java_feature_version(tmp_path / "bin" / "java") == version


def test_a_java_too_old_for_dynamic_archives_gets_none(cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "jdk8"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("")
    (home / "release").write_text('JAVA_VERSION="1.8.0_392"\n')
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert class_archive.plan(_jars(tmp_path), "").options == ""


START = """
from bridge.pipeline.spark import _jvm, spark_context, stop_spark
sc = spark_context("local[1]")
assert sc.parallelize(range(10), 2).map(lambda x: x * 2).sum() == 90
# what the driver JVM has mapped: the archive's path when it runs from it
maps = open(f"/proc/{_jvm['gateway'].proc.pid}/maps").read()
print("mapped" if ".jsa" in maps and "spark-driver-" in maps else "not mapped")
stop_spark(sc)
"""


@pytest.mark.slow
def test_a_real_driver_dumps_its_classes_once_and_the_next_start_maps_them(cache: Path) -> None:
    _java()
    env = {**os.environ, "QBRIDGE_CACHE_DIR": str(cache)}

    def start() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=300)

    first = start()
    assert first.returncode == 0, first.stderr[-2000:]
    kept = list(cache.glob("spark-driver-*.jsa"))
    assert len(kept) == 1 and kept[0].stat().st_size > 1_000_000, list(cache.iterdir())
    assert not list(cache.glob("*.partial"))
    assert "CDS" not in first.stdout + first.stderr  # the dump's warnings are silenced
    assert first.stdout.strip().endswith("not mapped")
    second = start()
    assert second.returncode == 0, second.stderr[-2000:]
    assert list(cache.glob("spark-driver-*.jsa")) == kept and not list(cache.glob("*.partial"))
    assert "CDS" not in second.stdout + second.stderr
    assert second.stdout.strip().endswith("mapped") and not second.stdout.strip().endswith("not mapped")
