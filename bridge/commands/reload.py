"""`qbridge reload -c CONFIG`: checks the config, then has every `qbridge run` of it on this
host re-read it (SIGHUP). Processes are found by their command line in /proc (Linux); those on
other hosts are not seen: run it there too (or `kill -HUP` them)."""

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
        if _subcommand(argv) != "run":
            continue
        if any((cwd / p).resolve() == wanted for p in _config_paths(argv)):
            found.append(int(entry.name))
    return sorted(found)


def _subcommand(argv: list[str]) -> str | None:
    """The qbridge command a command line runs (`qbridge run ...`, `python3 -m bridge --log-level
    INFO run ...`), or None for another program: `sync --job run` is not a run."""
    for i, a in enumerate(argv[:3]):
        if Path(a).name in ("qbridge", "bridge") or (a == "bridge" and i > 0 and argv[i - 1] == "-m"):
            rest = argv[i + 1:]
            break
    else:
        return None
    j = 0
    while j < len(rest):
        if rest[j] in ("--log-level", "--log-format"):
            j += 2
        elif rest[j].startswith("-"):
            j += 1
        else:
            return rest[j]
    return None


def _config_paths(argv: list[str]) -> list[str]:
    """What a command line gives as its config: `-c P`, `--config P`, `--config=P` or `-cP`."""
    paths = []
    for i, a in enumerate(argv):
        if a in ("-c", "--config") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif a.startswith("--config="):
            paths.append(a.split("=", 1)[1])
        elif a.startswith("-c") and len(a) > 2 and not a.startswith("--"):
            paths.append(a[2:])
    return [p for p in paths if p]


def cmd_reload(args: argparse.Namespace) -> int:
    path = Path(args.config)
    config = load_config(path)  # a broken config stops here, with its located error, before any signal
    config.select(args.job)
    pids = runs_of(path)
    if not hasattr(signal, "SIGHUP") or not Path("/proc").is_dir():
        raise UsageError("qbridge reload finds `qbridge run` processes through /proc (Linux); here, send SIGHUP to "
                         "each one yourself")
    signalled, refused = [], []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGHUP)
            signalled.append(pid)
        except ProcessLookupError:
            pass  # it ended meanwhile
        except PermissionError:
            refused.append(pid)
    if refused:
        err.print(f"not allowed to signal pid {', '.join(map(str, refused))} (another user's qbridge run): run "
                  f"`qbridge reload` as that user, or `kill -HUP` as root", markup=False, highlight=False)
    pids = signalled
    host = socket.gethostname()
    if pids:
        out.print(f"config {path} is valid; asked {len(pids)} qbridge run process(es) on {host} to reload it (pid "
                  f"{', '.join(map(str, pids))}); each logs what it applied or refused", markup=False, highlight=False, soft_wrap=True)
    else:
        err.print(f"config {path} is valid, but no `qbridge run -c {path}` runs on {host}", markup=False, highlight=False)
    return 0 if pids and not refused else 1
