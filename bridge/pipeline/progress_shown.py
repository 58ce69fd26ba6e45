"""Progress of long work, as an operator sees it wherever it runs: a bar per line of work on a
terminal, else a log line every 10 s (and one at the end), so that a migration or a rollback run
by a scheduler, over ssh or into a log file says that it moves and how far it is."""

from __future__ import annotations

import logging
import time
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

log = logging.getLogger("qbridge.progress")

LINE_EVERY = 10.0  # seconds between lines where there is no terminal


class Shown:
    """`update(label, done, total)` for each line of work (a queue, units, rows); `what` names the
    work in the log lines ("withdrawn", "done")."""

    def __init__(self, console: Console, what: str, every: float = LINE_EVERY) -> None:
        self.what, self.every = what, every
        self.began = self.said = time.monotonic()
        self.lines: dict[str, tuple[int, int]] = {}
        self.progress: Progress | None = None
        self.bars: dict[str, TaskID] = {}
        if console.is_terminal:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
            self.progress = Progress(*columns, console=console, transient=False)

    def __enter__(self) -> Self:
        if self.progress is not None:
            self.progress.start()
        return self

    def update(self, label: str, done: int, total: int) -> None:
        self.lines[label] = (done, total)
        if self.progress is not None:
            if label not in self.bars:
                self.bars[label] = self.progress.add_task(label, total=max(total, 1))
            self.progress.update(self.bars[label], completed=done, total=max(total, 1))
        elif time.monotonic() - self.said >= self.every:
            self.said = time.monotonic()
            self._line()

    def _line(self) -> None:
        parts = [f"{label} {done:,} of {total:,}" + (f" ({done / total:.0%})" if total else "")
                 for label, (done, total) in self.lines.items()]
        log.info("%s: %s, %.0fs", self.what, "; ".join(parts) or "starting", time.monotonic() - self.began)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
        elif exc[0] is None and self.lines:
            self._line()
