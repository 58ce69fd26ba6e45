"""What a target is: where a job's messages go, and where its ledger lives beside them.

A target turns a canonical message into rows of its own (`envelope`) and writes a batch of
them inside the caller's transaction (`write`). The ledger, checkpoints and quarantine live
in the same database, so rows and ledger entries commit together (GUIDE guarantee 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import sqlalchemy as sa

from bridge.config import JobConfig
from bridge.mapping import Mapping
from bridge.model import CanonicalMessage, PlainMessage
from bridge.sources.base import Subscription


@dataclass(frozen=True)
class Skipped:
    """A message a mapping rule (or the echo guard) leaves undelivered, with the rule."""

    reason: str


class Target:
    """One job's destination. Subclasses implement the primitives below."""

    system: ClassVar[str]
    # Whether the target keeps a message until its due time itself; if not, a delayed message
    # waits in the source until it is due.
    schedules: ClassVar[bool] = True

    def __init__(self, job: JobConfig, url: str, mapping: Mapping) -> None:
        self.job = job
        self.url = url
        self.mapping = mapping
        self.backend = sa.engine.make_url(url).get_backend_name()

    @property
    def state_schema(self) -> str | None:
        """Schema of qbridge's ledger, checkpoint and quarantine tables in this database."""
        raise NotImplementedError

    @property
    def reads_per_batch(self) -> bool:
        """Whether `begin_batch` reads the target database: a replay connects for it before it
        maps each message only where it does (OpenJMS, BizTalk)."""
        return type(self).begin_batch is not Target.begin_batch

    def begin_batch(self, conn: sa.Connection) -> None:
        """Reads what `envelope` needs from the target database, once per batch (nothing by default)."""

    def envelope(self, msg: CanonicalMessage, translated: frozenset[str]) -> Any:
        """The row(s) `msg` becomes, or Skipped; raises BadRow when it cannot go anywhere."""
        raise NotImplementedError

    def plain_envelope(self, msg: PlainMessage, translated: frozenset[str]) -> Any | None:
        """`envelope` of a plain message, or None to leave it to `envelope` (the default: targets
        without a fast lane get every message as a CanonicalMessage)."""
        return None

    def plain_columns(self, cols: Any, translated: frozenset[str]) -> Any:
        """The columnar lane: what a source's PlainColumns become, group by group, or None to leave
        them to the fast lane (the default)."""
        return None

    def ledger_target(self, out: Any) -> str:
        """Where `out` went, as the ledger records it."""
        raise NotImplementedError

    def write(self, conn: sa.Connection, outs: Sequence[Any]) -> None:
        """Writes a batch inside the caller's transaction."""
        raise NotImplementedError

    def subscriptions(self, conn: sa.Connection) -> list[Subscription]:
        """Live subscriptions the legacy side holds (reverse jobs route them to proxy queues)."""
        return []

    def notes(self, dialect: sa.Dialect) -> list[str]:
        """SQL comments `init --print-sql` adds after the DDL (settings for the legacy side)."""
        return []

    def tables(self) -> list[sa.Table]:
        """The tables of its own this target writes (for `init`), in one MetaData."""
        raise NotImplementedError
