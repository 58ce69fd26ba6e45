"""A rollback takes messages back off the NServiceBus queues, so it asks first (issue 46.4): on a
terminal it says what it will withdraw and waits for a yes; without one it refuses unless
`--yes`; while it runs it shows how far it is (a bar per queue on a terminal, a log line every
10 s without one)."""

from __future__ import annotations

import io
import logging
import os
import pty
import select
import subprocess
import time

import pytest
from rich.console import Console

from bridge.pipeline.progress_shown import Shown
from helpers import Bridge


def _delivered(tmp_path) -> Bridge:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.insert(b.ready(30))
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 30
    return b


def _on_a_terminal(b: Bridge, answer: str) -> tuple[int, str]:
    """`qbridge rollback --job job1` with a pseudo-terminal for stdin and stderr, answering `answer`."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(b.spawn_args("rollback", "--job", "job1"), stdin=slave, stdout=subprocess.PIPE, stderr=slave,
                            env={**os.environ, "COLUMNS": "200", "TERM": "xterm"})
    os.close(slave)
    seen, answered, deadline = b"", False, time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break  # the child closed the terminal
            if not chunk:
                break
            seen += chunk
        if not answered and b"Go on?" in seen:
            os.write(master, answer.encode() + b"\n")
            answered = True
        if proc.poll() is not None and not ready:
            break
    proc.wait(30)
    os.close(master)
    return proc.returncode, seen.decode(errors="replace")


def test_without_a_terminal_it_refuses_unless_yes(tmp_path) -> None:
    b = _delivered(tmp_path)
    r = subprocess.run(b.spawn_args("rollback", "--job", "job1"), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    said = " ".join(r.stderr.split())
    assert "--yes" in said and "withdraw" in said and "nothing done" in said, r.stderr
    assert b.count("Orders") == 30
    r = subprocess.run(b.spawn_args("rollback", "--yes", "--job", "job1"), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert b.count("Orders") == 0


def test_on_a_terminal_it_asks_and_a_no_does_nothing(tmp_path) -> None:
    b = _delivered(tmp_path)
    code, seen = _on_a_terminal(b, "n")
    assert "withdraw from the NServiceBus queues" in seen and "Go on?" in seen, seen
    assert code == 1 and "nothing done" in seen, seen
    assert b.count("Orders") == 30
    code, seen = _on_a_terminal(b, "y")
    assert code == 0, seen
    assert "MQueue1" in seen and "30/30" in seen, seen  # the queue's bar, full
    assert b.count("Orders") == 0


def test_without_a_terminal_progress_is_a_line_every_so_often(caplog: pytest.LogCaptureFixture) -> None:
    console = Console(file=io.StringIO(), force_terminal=False)
    with caplog.at_level(logging.INFO, logger="qbridge.progress"), Shown(console, "rollback", every=0) as shown:
        shown.update("MQueue1", 0, 3000)
        shown.update("MQueue1", 1000, 3000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("rollback: MQueue1 0 of 3,000 (0%)"), lines
    assert lines[1].startswith("rollback: MQueue1 1,000 of 3,000 (33%)"), lines
    assert lines[-1].startswith("rollback: MQueue1 1,000 of 3,000"), lines  # and one at the end
