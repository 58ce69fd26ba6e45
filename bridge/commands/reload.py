"""`qbridge reload -c CONFIG`: checks the config, then has every `qbridge run` of it on this
host re-read it (SIGHUP). Processes are found by their command line in /proc (Linux); a job
held by a process on another host is named, with the command to run there."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from pathlib import Path

from bridge.commands.common import err, out
from bridge.config import load_config
from bridge.errors import UsageError


def runs_of(config: Path) -> list[int]:
    """The pids of this host's `qbridge run` processes started with this config file."""
    wanted = config.resolve()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if "run" not in argv or not any("bridge" in a or "qbridge" in a for a in argv[:3]):
            continue
        for flag in ("-c", "--config"):
            if flag in argv[:-1] and (cwd / argv[argv.index(flag) + 1]).resolve() == wanted:
                found.append(int(entry.name))
                break
    return sorted(found)


def cmd_reload(args: argparse.Namespace) -> int:
    path = Path(args.config)
    config = load_config(path)  # a broken config stops here, with its located error, before any signal
    config.select(args.job)
    pids = runs_of(path)
    if not hasattr(signal, "SIGHUP") or not Path("/proc").is_dir():
        raise UsageError("qbridge reload finds `qbridge run` processes through /proc (Linux); here, send SIGHUP to "
                         "each one yourself")
    for pid in pids:
        os.kill(pid, signal.SIGHUP)
    host = socket.gethostname()
    if pids:
        out.print(f"config {path} is valid; asked {len(pids)} qbridge run process(es) on {host} to reload it (pid "
                  f"{', '.join(map(str, pids))}); each logs what it applied or refused", markup=False, highlight=False)
    else:
        err.print(f"config {path} is valid, but no `qbridge run -c {path}` runs on {host}", markup=False, highlight=False)
    return 0 if pids else 1
