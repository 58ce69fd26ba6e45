"""How many CPUs this process can use: what `local[*]` plans its task slots from.

`os.cpu_count()` counts the host's CPUs. In a container pinned to fewer CPUs (a cpuset) or given a
CPU quota, that plans more task slots than the process can run at once; Spark's own `local[*]`
asked the JVM, whose `availableProcessors` counts both (JDK 10+ container support).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The CPUs this process may run on (its affinity), capped by its cgroup's CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = cpu_quota(root, proc_cgroup)
    return max(1, min(cpus, quota) if quota else cpus)


def cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """CPUs' worth of this process's cgroup CPU quota, rounded up (as the JVM rounds it); None
    when there is none or it cannot be read. cgroup v2 (`cpu.max`) first, then v1's cfs files."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    paths = {}
    for line in lines:  # hierarchy-id:controllers:path
        parts = line.split(":", 2)
        if len(parts) == 3:  # anything else is not a cgroup line: planning must not fail on it
            paths[parts[1]] = parts[2].lstrip("/")
    if "" in paths:  # the v2 unified hierarchy
        text = _first_readable(root, paths[""], "cpu.max")
        if text is not None:
            try:
                quota, period = text.split()
                return None if quota == "max" else math.ceil(int(quota) / int(period))
            except ValueError:
                return None
    for controllers, path in paths.items():
        if "cpu" in controllers.split(","):
            quota_us = _first_readable(root / controllers, path, "cpu.cfs_quota_us")
            period_us = _first_readable(root / controllers, path, "cpu.cfs_period_us")
            try:
                q, p = int(quota_us or "-1"), int(period_us or "0")
            except ValueError:
                return None
            return math.ceil(q / p) if q > 0 and p > 0 else None
    return None


def _first_readable(base: Path, path: str, name: str) -> str | None:
    """A cgroup file at the process's cgroup path, or at the mount's root: a container sees its own
    cgroup mounted as the root while /proc/self/cgroup may still name the host's path."""
    for directory in (base / path, base):
        try:
            return (directory / name).read_text().strip()
        except OSError:
            continue
    return None
