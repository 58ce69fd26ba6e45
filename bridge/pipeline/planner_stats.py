"""The ledger's planner statistics during `migrate` (bridge.db.analyze): a ledger filled from
empty by Spark units is sampled as they complete, a logarithmic number of times."""

from __future__ import annotations

from typing import Any

from bridge.db import analyze


class LedgerStats:
    """Keeps the target databases' planner statistics of the ledger up with what the units
    write: refreshed each time the completed units double (1, 2, 4, ...), so a ledger filled
    from empty is sampled a logarithmic number of times, each a fixed-size sample."""

    def __init__(self, plans: list[Any]) -> None:
        self.runners = list({id(p.runner.target_engine): p.runner for p in plans}.values())
        self.next_at = 1

    def units_completed(self, done: int) -> None:
        if done >= self.next_at:
            self.next_at = 2 * max(done, self.next_at)
            self.refresh()

    def refresh(self) -> None:
        for runner in self.runners:
            analyze(runner.target_engine, runner.state.ledger)
