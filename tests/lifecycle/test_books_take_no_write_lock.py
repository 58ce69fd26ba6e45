"""The books (`qbridge status`, `verify`, the status page and /metrics) only read, and on SQLite
take no write lock: a job's pass holds the legacy file's write lock and then the target's, and
books that took the target's write lock and then waited for the legacy one's deadlocked against
it until SQLite's 30 s busy timeout (CI of 2026-11-29: a batch of one row took 30.07 s, the
backlog went missing from /metrics, and the alert test's alerts flapped)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers import Bridge

from bridge.commands.books import steering_history
from bridge.lifecycle.verify import status, verify


def _moved(tmp_path: Path) -> Bridge:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.insert(b.ready(3))
    assert b.cli("sync", "--once") == 0
    assert b.cli("pause", "--job", "job1", "--why", "a look") == 0 and b.cli("resume", "--job", "job1") == 0
    b.insert(b.ready(2, start=100))
    return b


def _holding(path: Path) -> sqlite3.Connection:
    """Another process's writer, mid-transaction: it holds the file's write lock."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_the_books_are_read_while_a_pass_holds_each_file_write_lock(tmp_path: Path) -> None:
    b = _moved(tmp_path)
    runner = b.runner()
    for held in ("l.db", "n.db"):
        writer = _holding(tmp_path / held)
        try:
            started = time.monotonic()
            books = status(runner)
            checked = verify(runner)
            history = steering_history(runner, 10)  # `status --history`
            took = time.monotonic() - started
        finally:
            writer.rollback()
            writer.close()
        assert books["source_error"] is None, (held, books["source_error"])
        assert books["backlog"] == 2 and books["rows_moved"] == 3, (held, books)
        assert checked.queues[0].delivered == 3 and checked.balanced, (held, checked)
        assert [a["action"] for a in history] == ["resumed", "paused"], history
        assert took < 10, f"the books waited {took:.1f} s for the write lock of {held}"


def test_a_pass_that_locks_the_legacy_file_then_the_target_commits_beside_the_books(tmp_path: Path) -> None:
    """The very interleaving: the books have read the target's ledger when a pass, holding the
    legacy file's write lock, asks for the target's; the books then read the legacy file.
    Neither waits for the other for long (before: each waited for the other, 30 s)."""
    b = _moved(tmp_path)
    runner = b.runner()
    legacy = _holding(tmp_path / "l.db")
    done: dict[str, float] = {}

    def the_pass() -> None:  # waits for the target's write lock, writes, commits both
        target = sqlite3.connect(tmp_path / "n.db", isolation_level=None, timeout=30)
        try:
            started = time.monotonic()
            target.execute("BEGIN IMMEDIATE")
            target.execute("create table pass_wrote (x int)")
            target.execute("COMMIT")
            legacy.execute("COMMIT")
            done["pass"] = time.monotonic() - started
        finally:
            target.close()

    t = threading.Thread(target=the_pass)
    read_ledger = runner.state.recorded_keys

    def the_pass_comes_now(*args: Any, **kwargs: Any) -> Iterator[Any]:
        rows = read_ledger(*args, **kwargs)
        first = next(rows, None)  # the books are inside their reading of the target
        t.start()
        time.sleep(0.5)  # the pass asks for the target's write lock meanwhile
        if first is not None:
            yield first
        yield from rows

    runner.state.recorded_keys = the_pass_comes_now  # type: ignore[method-assign]
    started = time.monotonic()
    books = status(runner)
    done["books"] = time.monotonic() - started
    t.join(40)
    legacy.close()
    assert books["source_error"] is None and books["backlog"] == 2, books
    assert done.get("pass", 99) < 10 and done["books"] < 10, done
