"""`sync --once` counts each queue's backlog only to size its progress bars: where the console is
no terminal (a scheduler, a pipe, CI) none is drawn and no count is made, which for a scan source
is a walk of every key against the ledger before the passes walk them again."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from rich.console import Console

from bridge.pipeline.inprocess import run_inprocess
from tests.systems.test_biztalk_source import SMALL, fx, make_bt

QUEUE = "BizTalkServerApplication"


@pytest.mark.parametrize("terminal", [True, False])
def test_the_backlog_is_walked_only_for_a_progress_bar(tmp_path: Path, request: Any, terminal: bool) -> None:
    walks: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if f'FROM "{QUEUE}Q"' in statement and "ORDER BY" in statement:  # a key walk of the work queue
            walks.append(statement)

    for bt in make_bt("sqlite", request, tmp_path):
        for _ in range(3):
            bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL])
        runner = bt.runner()
        sa.event.listen(runner.source_engine, "before_cursor_execute", seen)
        try:
            console = Console(file=io.StringIO(), force_terminal=terminal)
            [done] = run_inprocess([runner], console=console)
        finally:
            sa.event.remove(runner.source_engine, "before_cursor_execute", seen)
        assert done.delivered == 3 and bt.count("Orders") == 3
        # one pass walks the queue and finds the 3, fewer than a batch: the drain ends
        assert len(walks) == (2 if terminal else 1), walks
