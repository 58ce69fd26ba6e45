"""BizTalk as a target: a staging table a WCF-SQL polling receive location reads.

BizTalk's MessageBox is not written from outside: messages enter through receive locations.
The WCF-SQL adapter's polling mode runs `PolledDataAvailableStatement`, then `PollingStatement`
in the same transaction as it submits what the statement returned (`UseAmbientTransaction`),
so a row is taken once. qbridge writes one row per message, with the body, BTS.MessageType and
the NServiceBus headers BizTalk routes on as columns; `polling_statements` gives the two
statements for a receive location (docs/reverse-jobs.md, and `qbridge init --print-sql`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from bridge.codecs.echo import ECHO_HEADER, source_tag
from bridge.config import JobConfig
from bridge.errors import TargetSchemaError
from bridge.identifiers import url_identity
from bridge.mapping import Mapping
from bridge.model import CanonicalMessage
from bridge.targets.base import Skipped, Target
from bridge.targets.bulk import insert_rows
from bridge.targets.reverse import ReverseRules
from bridge.timefmt import naive_utc

DEFAULT_TABLE = "QBridgeToBizTalk"
BATCH = 50  # rows a polling statement takes per submission


def staging_table(name: str, schema: str | None, metadata: sa.MetaData | None = None) -> sa.Table:
    def text(n: int | None = None) -> sa.types.TypeEngine:
        return sa.Unicode(n) if n else sa.UnicodeText().with_variant(mssql.NVARCHAR(None), "mssql")

    def time() -> sa.types.TypeEngine:
        return sa.DateTime().with_variant(mssql.DATETIME2(), "mssql")

    t = sa.Table(
        name, metadata or sa.MetaData(),
        sa.Column("Id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("ReceiveLocation", text(128), nullable=False),
        sa.Column("MessageId", text(200), nullable=False),
        sa.Column("MessageType", text(256)),
        sa.Column("CorrelationId", text(200)),
        sa.Column("ConversationId", text(200)),
        sa.Column("ReplyTo", text(260)),
        sa.Column("Intent", text(16)),
        sa.Column("OriginatingEndpoint", text(200)),
        sa.Column("ContentType", text(100)),
        sa.Column("TimeSent", time(), nullable=False),
        sa.Column("Due", time()),
        sa.Column("Expires", time()),
        sa.Column("Headers", text(), nullable=False),
        sa.Column("Body", sa.LargeBinary().with_variant(mssql.VARBINARY("max"), "mssql")),
        sa.Column("Status", sa.SmallInteger(), nullable=False, server_default=sa.text("0")),  # 0 waiting, 1 taken
        sa.Column("TakenAt", time()),
        schema=schema,
    )
    sa.Index(f"IX_{name}_poll", t.c.ReceiveLocation, t.c.Status, t.c.Id)
    return t


def polling_statements(table: sa.Table, location: str, dialect: sa.Dialect | None = None) -> dict[str, str]:
    """The WCF-SQL binding's PolledDataAvailableStatement and PollingStatement (T-SQL) for the
    receive location that takes `location`'s rows: oldest first, locked rows skipped, due only."""
    dialect = dialect or mssql.dialect()
    full = dialect.identifier_preparer.format_table(table)
    where = (f"ReceiveLocation = N'{location.replace(chr(39), chr(39) * 2)}' AND Status = 0 "
             "AND (Due IS NULL OR Due <= SYSUTCDATETIME()) AND (Expires IS NULL OR Expires > SYSUTCDATETIME())")
    return {
        "PolledDataAvailableStatement": f"SELECT COUNT(*) FROM {full} WITH (READPAST) WHERE {where}",
        "PollingStatement": (
            f"WITH next AS (SELECT TOP ({BATCH}) * FROM {full} WITH (UPDLOCK, ROWLOCK, READPAST) WHERE {where} ORDER BY Id) "
            "UPDATE next SET Status = 1, TakenAt = SYSUTCDATETIME() "
            "OUTPUT inserted.Id, inserted.MessageId, inserted.MessageType, inserted.CorrelationId, inserted.ConversationId, "
            "inserted.ReplyTo, inserted.Intent, inserted.OriginatingEndpoint, inserted.ContentType, inserted.TimeSent, "
            "inserted.Headers, inserted.Body"
        ),
    }


class StagingRow(NamedTuple):
    location: str
    values: dict[str, Any]


class BizTalkTarget(Target):
    system: ClassVar[str] = "biztalk"

    def __init__(self, job: JobConfig, url: str, mapping: Mapping) -> None:
        super().__init__(job, url, mapping)
        self.identity = job.target.database or url_identity(url)
        self.rules = ReverseRules(mapping)
        self.table = staging_table(job.target.table or DEFAULT_TABLE, self.state_schema)
        self._checked = False

    @property
    def state_schema(self) -> str | None:
        return None if self.backend == "sqlite" else self.job.target.schema_

    def begin_batch(self, conn: sa.Connection) -> None:
        if not self._checked:
            if not sa.inspect(conn).has_table(self.table.name, schema=self.table.schema):
                raise TargetSchemaError(f"BizTalk staging table {self.table.fullname!r} does not exist; run `qbridge init -c CONFIG`")
            self._checked = True

    def envelope(self, msg: CanonicalMessage, translated: frozenset[str]) -> StagingRow | Skipped:
        location = self.rules.destination(msg, self.system, self.identity)
        if isinstance(location, Skipped):
            return location
        message_type = self.rules.known_type(msg)
        headers = self.rules.headers(msg, self.rules.template_values(msg, location, message_type or ""))
        headers[ECHO_HEADER] = source_tag(msg.source.system, msg.source.database, msg.source.queue, msg.source.key)
        h = msg.headers
        return StagingRow(location, {
            "ReceiveLocation": location, "MessageId": msg.source.key,
            # No legacy name: NULL, and BizTalk's XML disassembler derives BTS.MessageType from the body.
            "MessageType": message_type,
            "CorrelationId": msg.correlation_id, "ConversationId": msg.conversation_id,
            "ReplyTo": h.get("NServiceBus.ReplyToAddress"), "Intent": msg.intent,
            "OriginatingEndpoint": h.get("NServiceBus.OriginatingEndpoint"), "ContentType": msg.content_type,
            "TimeSent": naive_utc(msg.time_sent), "Due": naive_utc(msg.due) if msg.state == "delayed" else None,
            "Expires": naive_utc(msg.expires), "Headers": orjson.dumps(headers).decode(), "Body": msg.body,
            "Status": 0, "TakenAt": None,
        })

    def ledger_target(self, out: StagingRow) -> str:
        return f"{self.table.name}/{out.location}"

    def write(self, conn: sa.Connection, outs: Sequence[StagingRow]) -> None:
        insert_rows(conn, self.table, [o.values for o in outs])

    def tables(self) -> list[sa.Table]:
        return [self.table]

    def notes(self, dialect: sa.Dialect) -> list[str]:
        """For `init --print-sql`: the receive location settings per routed location."""
        out = []
        for location in self.mapping.target_queues():
            for name, stmt in polling_statements(self.table, location, dialect).items():
                out.append(f"-- receive location {location!r}, WCF-SQL {name}:\n-- {stmt}")
        return out
