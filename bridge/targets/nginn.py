"""NGinn.MessageBus as a target: rows NGinn's own receiver takes (the reverse direction).

Facts: reference/legacy-sources.md §1. A row is inserted as NGinn's InsertMessageBatch does:
`subqueue='I'` (or `'R'` with `retry_time` = the due time, which NGinn's cleanup thread moves
to `I`), server-local times, `to_endpoint` = the table's own `sql://alias/Table` (any other
endpoint makes NGinn forward the row), headers in its `k=v|` form, a Newtonsoft body whose
`$type` comes first, and `unique_id` = the NServiceBus message id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import orjson
import sqlalchemy as sa

from bridge.codecs import nginn as codec
from bridge.codecs.echo import ECHO_HEADER, source_tag
from bridge.config import JobConfig
from bridge.errors import BadRow, TargetSchemaError
from bridge.identifiers import url_identity
from bridge.mapping import Mapping
from bridge.model import CanonicalMessage
from bridge.schemas.nginn import queue_table
from bridge.sources.base import Subscription
from bridge.sources.nginn import live_subscriptions
from bridge.targets.base import Skipped, Target
from bridge.targets.bulk import insert_rows
from bridge.targets.reverse import ReverseRules
from bridge.timefmt import utcnow, zone

ENDPOINT_MAX = 50  # from_endpoint / to_endpoint are varchar(50)
COLUMN_MAX = {"correlation_id": 100, "label": 100, "unique_id": 40}


class NGinnRow(NamedTuple):
    queue: str
    values: dict[str, Any]


def nginn_body(body: bytes | None, legacy_type: str) -> str:
    """The body as Newtonsoft's TypeNameHandling.Objects reads it: a JSON object whose first
    property is `$type`. The original text is kept byte for byte behind the inserted `$type`."""
    if body is None:
        raise BadRow("the message has no body; NGinn's serializer needs a JSON object")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadRow(f"the body is not UTF-8 text ({e}); NGinn reads JSON bodies only") from None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise BadRow(f"the body is not JSON ({e}); NGinn reads JSON bodies only") from None
    if not isinstance(doc, dict):
        raise BadRow(f"the body is a JSON {type(doc).__name__}, not an object; NGinn can only type an object by its $type")
    type_json = orjson.dumps(legacy_type).decode()
    if "$type" not in doc:
        inner = text.lstrip()[1:]
        return '{"$type":' + type_json + ("," if doc else "") + inner
    rest = {k: v for k, v in doc.items() if k != "$type"}
    return orjson.dumps({"$type": legacy_type, **rest}).decode()


def headers_text(headers: dict[str, str]) -> str:
    """NGinn's `k=v|k=v`; it has no escaping, so a '|' or '=' would break the row on receive."""
    for name, value in headers.items():
        for what, text in (("name", name), ("value", value)):
            if "|" in text or "=" in text:
                raise BadRow(f"header {name!r}: its {what} holds '|' or '=', which NGinn's k=v| header format cannot "
                             "carry; drop it ([headers.drop]) or rename it ([headers.rename])")
    return "|".join(f"{k}={v}" for k, v in headers.items())


class NGinnTarget(Target):
    system: ClassVar[str] = "nginn"

    def __init__(self, job: JobConfig, url: str, mapping: Mapping) -> None:
        super().__init__(job, url, mapping)
        t = job.target
        self.tz = zone(t.timezone or "UTC")
        self.identity = t.database or url_identity(url)
        self.alias = t.alias or self.identity
        self.rules = ReverseRules(mapping)
        self.metadata = sa.MetaData()
        self._checked: set[str] = set()

    @property
    def state_schema(self) -> str | None:
        return None if self.backend == "sqlite" else self.job.target.schema_

    def table(self, queue: str) -> sa.Table:
        key = f"{self.state_schema}.{queue}" if self.state_schema else queue
        found = self.metadata.tables.get(key)
        return found if found is not None else queue_table(queue, self.state_schema, self.metadata)

    def endpoint(self, queue: str) -> str:
        uri = f"sql://{self.alias}/{queue}"
        if len(uri) > ENDPOINT_MAX:
            raise BadRow(f"NGinn endpoint {uri!r} is longer than {ENDPOINT_MAX} characters (from_endpoint/to_endpoint are varchar(50))")
        return uri

    def envelope(self, msg: CanonicalMessage, translated: frozenset[str]) -> NGinnRow | Skipped:
        queue = self.rules.destination(msg, self.system, self.identity)
        if isinstance(queue, Skipped):
            return queue
        legacy_type = self.rules.legacy_type(msg)
        body = nginn_body(msg.body, legacy_type)
        mid = msg.source.key
        headers = self.rules.headers(msg, self.rules.template_values(msg, queue, legacy_type))
        now = utcnow()
        if msg.reply_to:
            # Only an exact route renames a reply queue; else the NServiceBus queue's own name,
            # which a forward job reads from the legacy table of that name (inferred use by NGinn).
            headers[codec.HDR_REPLY_TO] = self.endpoint(self.mapping.routes.get(msg.reply_to, msg.reply_to))
        if msg.expires is not None:
            headers[codec.HDR_TTL] = self._local(msg.expires).strftime("%Y-%m-%d %H:%M:%S")
        headers[ECHO_HEADER] = source_tag(msg.source.system, msg.source.database, msg.source.queue, mid)
        delayed = msg.state == "delayed" and msg.due is not None and self.mapping.states.delayed != "queue"
        origin = msg.headers.get("NServiceBus.OriginatingEndpoint") or msg.source.queue
        row = {
            "from_endpoint": headers.get(codec.HDR_REPLY_TO) or self.endpoint(self.mapping.routes.get(origin, origin)),
            "to_endpoint": self.endpoint(queue),
            "subqueue": "R" if delayed else "I",
            "insert_time": self._local(now),
            "last_processed": None,
            "retry_count": 0,
            "retry_time": self._local(msg.due if delayed and msg.due else now),
            "error_info": None,
            "correlation_id": (msg.correlation_id or "")[:COLUMN_MAX["correlation_id"]] or None,
            # NGinn's label is the body's ToString(): a plain .NET object's is its type's FullName.
            "label": legacy_type.split(",")[0].strip()[:COLUMN_MAX["label"]],
            "msg_text": body,
            "msg_headers": headers_text(headers),
            "unique_id": mid if len(mid) <= COLUMN_MAX["unique_id"] else str(msg.message_id),
        }
        return NGinnRow(queue, row)

    def _local(self, value: Any) -> Any:
        return value.astimezone(self.tz).replace(tzinfo=None)

    def ledger_target(self, out: NGinnRow) -> str:
        return out.queue

    def write(self, conn: sa.Connection, outs: Sequence[NGinnRow]) -> None:
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for out in outs:
            groups[out.queue].append(out.values)
        for queue, rows in groups.items():
            table = self.table(queue)
            if table.fullname not in self._checked:
                if not sa.inspect(conn).has_table(table.name, schema=table.schema):
                    raise TargetSchemaError(f"NGinn queue table {table.fullname!r} does not exist in the legacy database; "
                                            "run `qbridge init -c CONFIG` (or create it with NGinn's createmqueue script)")
                self._checked.add(table.fullname)
            insert_rows(conn, table, rows)

    def subscriptions(self, conn: sa.Connection) -> list[Subscription]:
        return live_subscriptions(conn, self.state_schema, self.tz)

    def tables(self) -> list[sa.Table]:
        return [self.table(q) for q in self.mapping.target_queues()]
