"""The NServiceBus target of a forward job: transport tables, routing and headers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import sqlalchemy as sa

from bridge.config import JobConfig
from bridge.identifiers import url_identity
from bridge.mapping import Mapping
from bridge.model import CanonicalMessage, PlainMessage
from bridge.schemas.nservicebus import transport_tables
from bridge.targets.base import Skipped, Target
from bridge.targets.envelope import Outgoing, envelope, plain_envelope
from bridge.targets.writer import TargetWriter


class NServiceBusTarget(Target):
    system: ClassVar[str] = "nservicebus"

    def __init__(self, job: JobConfig, url: str, mapping: Mapping) -> None:
        super().__init__(job, url, mapping)
        t = job.target
        assert t.flavor is not None  # config validation requires it for NServiceBus targets
        self.transport = transport_tables(t.flavor, t.schema_name, url, t.catalog)
        self.writer = TargetWriter(self.transport)
        self.identity = t.database or url_identity(url)

    @property
    def state_schema(self) -> str | None:
        return self.transport.table_schema

    def envelope(self, msg: CanonicalMessage, translated: frozenset[str]) -> Outgoing | Skipped:
        return envelope(msg, self.mapping, self.transport, self.job.target, translated, self.identity)

    def plain_envelope(self, msg: PlainMessage, translated: frozenset[str]) -> Outgoing | Skipped | None:
        return plain_envelope(msg, self.mapping, self.transport, self.job.target, translated)

    def plain_columns(self, cols: Any, translated: frozenset[str]) -> Any:
        from bridge.targets.envelope_columns import lane_outcomes

        return lane_outcomes(cols, lambda msg: plain_envelope(msg, self.mapping, self.transport, self.job.target,
                                                              translated), self.ledger_target, self.mapping)

    def ledger_target(self, out: Outgoing) -> str:
        return f"{out.queue}.Delayed" if out.kind == "delayed" else out.queue

    def write(self, conn: sa.Connection, outs: Sequence[Outgoing]) -> None:
        self.writer.write(conn, outs)

    def tables(self) -> list[sa.Table]:
        p, states, t = self.transport, self.mapping.states, self.job.target
        out = []
        for queue in self.mapping.target_queues():
            out.append(p.queue(queue))
            if "delayed" in (states.ready, states.delayed, states.failed):
                out.append(p.delayed(queue))
        if "error" in (states.ready, states.delayed, states.failed, states.expired):
            out.append(p.queue(t.error_queue))
        if "audit" in (states.ready, states.delayed, states.failed, states.processed, states.expired):
            out.append(p.queue(t.audit_queue))
        out.append(p.subscriptions())
        return out
