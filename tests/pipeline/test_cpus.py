"""local[*] plans its task slots from the CPUs this process can use, not the host's count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.pipeline.cpus import cpu_quota, usable_cpus


def test_usable_cpus_follow_the_affinity_a_container_pins() -> None:
    """A process pinned to one CPU (a cpuset) plans local[*] as 1 + 1 slots, on any host."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from bridge.pipeline.spark import local_slots; print(local_slots('local[*]'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "2"
    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)


def _cgroup(tmp_path: Path, lines: str, files: dict[str, str]) -> tuple[Path, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(lines)
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root, proc


@pytest.mark.parametrize(("lines", "files", "expected"), [
    # cgroup v2: 1.5 CPUs' worth rounds up to 2, as the JVM rounds it
    ("0::/jobs/qbridge\n", {"jobs/qbridge/cpu.max": "150000 100000\n"}, 2),
    ("0::/jobs/qbridge\n", {"jobs/qbridge/cpu.max": "max 100000\n"}, None),
    # a container whose own cgroup is mounted at the root while /proc names the host's path
    ("0::/docker/abc\n", {"cpu.max": "100000 100000\n"}, 1),
    # cgroup v1, the cpu controller mounted with cpuacct
    ("4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
     {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, 3),
    ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
    # hybrid: a v2 entry with no cpu.max under it, the quota in v1's cpu controller
    ("0::/\n1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    # nothing readable, or garbage: no quota (the affinity alone decides)
    ("0::/gone\n", {}, None),
    ("0::/\n", {"cpu.max": "lots\n"}, None),
    # a line that is not hierarchy:controllers:path is passed over, not a crash of `migrate`
    ("garbage\n0::/\n", {"cpu.max": "200000 100000\n"}, 2),
])
def test_cgroup_cpu_quota(tmp_path: Path, lines: str, files: dict[str, str], expected: int | None) -> None:
    root, proc = _cgroup(tmp_path, lines, files)
    assert cpu_quota(root, proc) == expected


def test_a_quota_below_the_affinity_caps_the_usable_cpus(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "0::/\n", {"cpu.max": "100000 100000\n"})
    assert usable_cpus(root, proc) == 1
    root, proc = _cgroup(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000\n"})
    assert usable_cpus(root, proc) == len(os.sched_getaffinity(0))
