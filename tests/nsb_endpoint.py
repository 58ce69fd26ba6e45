"""A stand-in NServiceBus endpoint on PostgreSQL that uses the transports' own statements
(reference/nservicebus-target.md §1.6/§1.7 SQL Server flavor, §2 PostgreSQL flavor): receive
deletes the oldest unlocked row, send inserts with a database-computed Expires, publish looks
the subscribers up in SubscriptionRouting. Headers are set as NServiceBus core sets them."""

from __future__ import annotations

import os

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import orjson
import sqlalchemy as sa

from bridge.timefmt import to_wire


def _table_of(address: str) -> str:
    """`"Q"."schema"` (PostgreSQL transport) or `Q@[schema]@[catalog]` (SQL Server) -> Q."""
    if address.startswith('"'):
        return address[1:address.index('"', 1)]
    return address.split("@", 1)[0]


@dataclass
class Endpoint:
    engine: sa.Engine
    schema: str
    name: str  # the endpoint's own queue
    flavor: str = "postgresql"

    def _t(self, table: str) -> str:
        return f'"{self.schema}"."{table}"'

    def address(self, queue: str) -> str:
        if self.flavor == "sqlserver":
            return f"{queue}@[{self.schema}]"
        return f'"{queue}"."{self.schema}"'

    def receive(self) -> tuple[dict[str, str], bytes] | None:
        t = self._t(self.name)
        if self.flavor == "postgresql":
            sql = (f"DELETE FROM {t} rs WHERE rs.id = (SELECT id FROM {t} ORDER BY Seq LIMIT 1 FOR UPDATE SKIP LOCKED) "
                   "RETURNING rs.id, CASE WHEN Expires IS NULL THEN 0 WHEN Expires > now() AT TIME ZONE 'UTC' THEN 0 ELSE 1 END Expired, "
                   "rs.Headers, rs.Body")
        else:  # the SQL Server statement's PostgreSQL equivalent on the same columns
            sql = (f'DELETE FROM {t} rs WHERE rs."RowVersion" = (SELECT "RowVersion" FROM {t} ORDER BY "RowVersion" LIMIT 1 '
                   'FOR UPDATE SKIP LOCKED) RETURNING rs."Id", 0, rs."Headers", rs."Body"')
        with self.engine.begin() as conn:
            row = conn.execute(sa.text(sql)).first()
        if row is None:
            return None
        return orjson.loads(row[2]), bytes(row[3])

    def send(self, queue_address: str, headers: dict[str, str], body: bytes, ttbr_ms: int | None = None) -> None:
        t = self._t(_table_of(queue_address))
        text = orjson.dumps(headers).decode().replace("/", "\\/")
        if self.flavor == "postgresql":
            sql = (f"INSERT INTO {t} (Id, Expires, Headers, Body) VALUES (:id, (now() AT TIME ZONE 'UTC') + "
                   "(CAST(:ttbr AS text) || ' ms')::INTERVAL, :headers, :body)")
        else:
            sql = (f'INSERT INTO {t} ("Id", "Recoverable", "Expires", "Headers", "Body") VALUES (:id, true, '
                   "CASE WHEN CAST(:ttbr AS int) IS NOT NULL THEN (now() AT TIME ZONE 'UTC') + (CAST(:ttbr AS text) || ' ms')::INTERVAL END, "
                   ":headers, :body)")
        with self.engine.begin() as conn:
            conn.execute(sa.text(sql), {"id": uuid.uuid4(), "ttbr": ttbr_ms, "headers": text, "body": body})

    def headers(self, types: str, intent: str, **extra: str) -> dict[str, str]:
        mid = str(uuid.uuid4())
        return {
            "NServiceBus.MessageId": mid,
            "NServiceBus.MessageIntent": intent,
            "NServiceBus.ConversationId": extra.pop("conversation", mid),
            "NServiceBus.CorrelationId": extra.pop("correlation", mid),
            "NServiceBus.ReplyToAddress": self.address(self.name),
            "NServiceBus.OriginatingEndpoint": self.name,
            "NServiceBus.OriginatingMachine": "nsb-host",
            "NServiceBus.ContentType": "application/json",
            "NServiceBus.EnclosedMessageTypes": types,
            "NServiceBus.Version": "9.2.3",
            "NServiceBus.TimeSent": to_wire(datetime.now(timezone.utc)),
            "$.diagnostics.originating.hostid": uuid.uuid4().hex,
            **extra,
        }

    def reply(self, incoming: dict[str, str], types: str, body: bytes) -> dict[str, str]:
        """What `context.Reply` does: to the incoming ReplyToAddress, correlated to the request."""
        h = self.headers(types, "Reply", conversation=incoming["NServiceBus.ConversationId"],
                         correlation=incoming.get("NServiceBus.CorrelationId") or incoming["NServiceBus.MessageId"],
                         **{"NServiceBus.RelatedTo": incoming["NServiceBus.MessageId"]})
        if "traceparent" in incoming:
            # With OpenTelemetry on, the receive span is a child of the incoming traceparent and the
            # reply's send span is in that trace: the reply carries it with a span id of its own.
            _, trace_id, _, flags = incoming["traceparent"].split("-")
            h["traceparent"] = f"00-{trace_id}-{os.urandom(8).hex()}-{flags}"
        self.send(incoming["NServiceBus.ReplyToAddress"], h, body)
        return h

    def publish(self, topics: list[str], types: str, body: bytes) -> tuple[dict[str, str], int]:
        """Native publish: one copy per subscriber address found for the topics."""
        sub = self._t("SubscriptionRouting")
        cols = ("queueaddress", "topic") if self.flavor == "postgresql" else ('"QueueAddress"', '"Topic"')
        with self.engine.connect() as conn:
            addresses = conn.execute(sa.text(f"SELECT DISTINCT {cols[0]} FROM {sub} WHERE {cols[1]} = ANY(:t)"), {"t": topics}).scalars().all()
        h = self.headers(types, "Publish")
        for a in addresses:
            self.send(a, h, body)
        return h, len(addresses)
