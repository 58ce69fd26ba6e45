"""Bulk writes into transport tables, each driver by its fast path, inside the caller's transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
import sqlalchemy as sa

from bridge.errors import TargetSchemaError
from bridge.model import row_ids
from bridge.sources.base import Subscription
from bridge.targets.bulk import insert_values
from bridge.targets.envelope import Outgoing
from bridge.schemas.nservicebus import TargetTables
from bridge.timefmt import naive_utc


def headers_json(headers: dict[str, str]) -> str:
    """The flat JSON object the transports write; `/` escaped as DataContractJsonSerializer does."""
    # Escaped in the bytes: replacing in the decoded text costs twice as much.
    return orjson.dumps(headers).replace(b"/", b"\\/").decode("utf-8")


class TargetWriter:
    """Writes Outgoing rows for one target; remembers what it learned about existing tables."""

    def __init__(self, tables: TargetTables) -> None:
        self.tables = tables
        self._checked: dict[str, set[str]] = {}

    def _columns(self, conn: sa.Connection, table: sa.Table) -> set[str]:
        key = table.fullname
        if key not in self._checked:
            insp = sa.inspect(conn)
            if not insp.has_table(table.name, schema=table.schema):
                raise TargetSchemaError(
                    f"target table {table.fullname!r} does not exist; run `qbridge init -c CONFIG` "
                    "(or have the DBA run `qbridge init --print-sql`)"
                )
            self._checked[key] = {c["name"] for c in insp.get_columns(table.name, schema=table.schema)}
        return self._checked[key]

    def write(self, conn: sa.Connection, outs: Sequence[Outgoing]) -> None:
        groups: dict[tuple[str, str], list[Outgoing]] = defaultdict(list)
        for out in outs:
            groups[(out.kind, out.queue)].append(out)
        for (kind, queue), items in groups.items():
            table = self.tables.delayed(queue) if kind == "delayed" else self.tables.queue(queue)
            have = self._columns(conn, table)
            names, rows = self._rows(kind, items, have)
            insert_values(conn, table, names, rows)

    def _rows(self, kind: str, outs: list[Outgoing], have: set[str]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        """The column names and the rows of one transport table, as the flavor's transport writes them."""
        postgresql = self.tables.flavor == "postgresql"
        if kind == "delayed" and not postgresql:  # SQL Server's delayed table numbers its rows itself
            return ("Headers", "Body", "Due"), [(headers_json(o.headers), o.body, naive_utc(o.due)) for o in outs]
        # A fresh id per row, as the transports' own senders give (row_ids: growing, which keeps
        # the PostgreSQL queue table's primary key cheap to insert into).
        ids = row_ids(len(outs))
        if postgresql and kind == "delayed":
            return ("id", "headers", "body", "due"), [(i, headers_json(o.headers), o.body, o.due) for i, o in zip(ids, outs)]
        rows = [(i, naive_utc(o.expires), headers_json(o.headers), o.body) for i, o in zip(ids, outs)]
        if postgresql:
            return ("id", "expires", "headers", "body"), rows
        # Tables created by transport 7+ still have Recoverable (NOT NULL, no default); older
        # hand-made ones may not, and the transport itself checks before inserting.
        if "Recoverable" in have:
            return ("Id", "Expires", "Headers", "Body", "Recoverable"), [(*row, True) for row in rows]
        return ("Id", "Expires", "Headers", "Body"), rows

    def write_subscriptions(self, conn: sa.Connection, subs: Iterable[tuple[Subscription, str, str]]) -> int:
        """Upserts (subscription, routed endpoint, queue address) rows; returns how many changed."""
        t = self.tables.subscriptions()
        self._columns(conn, t)
        qa, ep, tp = (self.tables.column(t, n) for n in ("QueueAddress", "Endpoint", "Topic"))
        changed = 0
        for sub, endpoint, address in subs:
            topic = sub.topic
            existing = conn.execute(sa.select(qa).where(ep == endpoint, tp == topic)).scalar_one_or_none()
            if existing == address:
                continue
            if existing is None:
                conn.execute(sa.insert(t).values({qa.name: address, ep.name: endpoint, tp.name: topic}))
            else:
                conn.execute(sa.update(t).where(ep == endpoint, tp == topic).values({qa.name: address}))
            changed += 1
        return changed
