"""One message's ledger entry, as a batch's per-row lanes record it (bridge.ledger.state re-exports
it; the columnar lane's entries are columns, bridge.ledger.lane_entries)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["LedgerEntry"]


class LedgerEntry(NamedTuple):  # one per message: a NamedTuple is the cheapest immutable record
    message_id: str
    source_key: str
    outcome: str
    target: str | None = None
    reason: str | None = None
