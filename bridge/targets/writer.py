"""Bulk writes into transport tables, each driver by its fast path, inside the caller's transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa

from bridge import tracing
from bridge.codecs.nservicebus import headers_json
from bridge.errors import TargetSchemaError
from bridge.model import row_id_bytes, row_ids
from bridge.schemas.nservicebus import TargetTables
from bridge.sources.base import Subscription
from bridge.targets.bulk import copies, copy_arrow, insert_values
from bridge.targets.envelope import Outgoing
from bridge.timefmt import naive_utc

TRACEPARENT = tracing.TRACEPARENT

if TYPE_CHECKING:  # the columnar lane's types: Arrow is imported when a lane batch is written
    import pyarrow as pa

    from bridge.targets.envelope_columns import TableColumns


class TargetWriter:
    """Writes Outgoing rows for one target; remembers what it learned about existing tables."""

    def __init__(self, tables: TargetTables) -> None:
        self.tables = tables
        self._checked: dict[str, set[str]] = {}
        # Each message gets the W3C `traceparent` of the batch span writing it (issue 39), the
        # header NServiceBus's receive makes its span a child of; one the message has kept.
        self.trace_messages = False

    def _traceparent(self) -> str | None:
        return tracing.traceparent() if self.trace_messages else None

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

    def write(self, conn: sa.Connection, outs: Sequence[Outgoing | LaneBatch]) -> None:
        if len(outs) == 1 and isinstance(outs[0], LaneBatch):
            self.write_lane(conn, outs[0])
            return
        groups: dict[tuple[str, str], list[Outgoing]] = defaultdict(list)
        for out in cast("Sequence[Outgoing]", outs):  # a LaneBatch only ever comes alone (above)
            groups[(out.kind, out.queue)].append(out)
        parent = self._traceparent()
        for (kind, queue), items in groups.items():
            table, have = self.table(conn, kind, queue)
            texts = [headers_json(o.headers) for o in items]
            if parent:  # a message's own traceparent is kept if NServiceBus can parse it, else it is replaced
                suffix = f',"{TRACEPARENT}":"{parent}"}}'
                texts = [t if tracing.valid_traceparent(o.headers.get(TRACEPARENT)) else
                         headers_json({**o.headers, TRACEPARENT: parent}) if TRACEPARENT in o.headers else t[:-1] + suffix
                         for t, o in zip(texts, items)]
            names, rows = self._rows(kind, texts, [o.body for o in items],
                                     [naive_utc(o.expires) for o in items], [o.due for o in items], have)
            insert_values(conn, table, names, rows)

    def table(self, conn: sa.Connection, kind: str, queue: str) -> tuple[sa.Table, set[str]]:
        """The transport table a kind of row for `queue` goes into, and the columns it has."""
        table = self.tables.delayed(queue) if kind == "delayed" else self.tables.queue(queue)
        return table, self._columns(conn, table)

    def _rows(self, kind: str, headers: list[str], bodies: list[bytes | None], expires: list[Any], dues: list[Any],
              have: set[str]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        """The column names and the rows of one transport table, as the flavor's transport writes
        them, from each row's header JSON, body, naive UTC expiry and aware due time."""
        postgresql = self.tables.flavor == "postgresql"
        if kind == "delayed" and not postgresql:  # SQL Server's delayed table numbers its rows itself
            return ("Headers", "Body", "Due"), list(zip(headers, bodies, [naive_utc(d) for d in dues]))
        # A fresh id per row, as the transports' own senders give (row_ids: growing, which keeps
        # the PostgreSQL queue table's primary key cheap to insert into).
        ids = row_ids(len(headers))
        if postgresql and kind == "delayed":
            return ("id", "headers", "body", "due"), list(zip(ids, headers, bodies, dues))
        rows = list(zip(ids, expires, headers, bodies))
        if postgresql:
            return ("id", "expires", "headers", "body"), rows
        # Tables created by transport 7+ still have Recoverable (NOT NULL, no default); older
        # hand-made ones may not, and the transport itself checks before inserting.
        if "Recoverable" in have:
            return ("Id", "Expires", "Headers", "Body", "Recoverable"), [(*row, True) for row in rows]
        return ("Id", "Expires", "Headers", "Body"), rows

    def write_lane(self, conn: sa.Connection, batch: LaneBatch) -> None:
        """Every table's rows in batch order, so the queue's `seq` orders them as the per-row lane would."""
        import numpy as np
        import pyarrow as pa

        utc, naive = pa.timestamp("us", "UTC"), pa.timestamp("us")
        parent = self._traceparent()
        parts: dict[tuple[str, str], list[TableColumns]] = {}
        for t in batch.tables:
            parts.setdefault((t.kind, t.queue), []).append(t)
        singles: dict[tuple[str, str], list[tuple[int, Outgoing]]] = {}
        for at, out in batch.outs:
            singles.setdefault((out.kind, out.queue), []).append((at, out))
        for kind, queue in dict.fromkeys([*parts, *singles]):
            lane, rows = parts.get((kind, queue), []), singles.get((kind, queue), [])
            positions = np.concatenate([t.positions for t in lane] + [np.array([at for at, _ in rows], dtype=np.int64)])
            # Each column's parts as one chunked array: the take into batch order below copies
            # them once (a concatenation first would copy every header and body twice).
            headers = _parts([t.headers for t in lane], pa.array([headers_json(o.headers) for _, o in rows], pa.string()) if rows else None)
            bodies = _parts([t.bodies for t in lane], pa.array([o.body for _, o in rows], pa.binary()) if rows else None)
            expires = _parts([pa.array([naive_utc(t.expires)] * len(t.positions), naive) if t.expires else
                              pa.nulls(len(t.positions), naive) for t in lane],
                             pa.array([naive_utc(o.expires) for _, o in rows], naive) if rows else None)
            dues = _parts([t.due if t.due is not None else pa.nulls(len(t.positions), utc) for t in lane],
                          pa.array([o.due for _, o in rows], utc) if rows else None)
            if parent:  # the same header, added to the JSON text column by column
                import pyarrow.compute as pc

                traced = pc.binary_join_element_wise(pc.utf8_slice_codeunits(headers, 0, -1),
                                                     pa.scalar(f',"{TRACEPARENT}":"{parent}"}}'), "")
                # Which rows have the header is told by its parsed name: a lane group's rows all
                # have its example's names; never by searching the JSON text.
                own = pa.array(np.concatenate([np.full(len(t.positions), t.traced) for t in lane]
                                              + [np.array([TRACEPARENT in o.headers for _, o in rows], dtype=bool)]))
                if pc.any(own).as_py():  # kept if NServiceBus can parse it (tracing.valid_traceparent), else replaced
                    kept = pc.and_(pc.match_substring_regex(headers, tracing.TRACEPARENT_JSON_VALID),
                                   pc.invert(pc.match_substring_regex(headers, tracing.TRACEPARENT_JSON_ZEROS)))
                    fixed = pc.replace_substring_regex(headers, tracing.TRACEPARENT_JSON_ANY, f'\\1"{TRACEPARENT}":"{parent}"')
                    headers = pc.if_else(own, pc.if_else(kept, headers, fixed), traced)
                else:
                    headers = traced
            order = np.argsort(positions, kind="stable")
            self._write_columns(conn, kind, queue, *(_in_order(a, order) for a in (headers, bodies, expires, dues)))

    def _write_columns(self, conn: sa.Connection, kind: str, queue: str, headers: pa.Array, bodies: pa.Array,
                       expires: pa.Array, dues: pa.Array) -> None:
        """One transport table's rows, given as columns: COPY BINARY from Arrow on PostgreSQL,
        the flavor's rows by `_rows` elsewhere."""
        import pyarrow as pa

        table, have = self.table(conn, kind, queue)
        if copies(conn) and self.tables.flavor == "postgresql":
            ids = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(headers), [None, pa.py_buffer(row_id_bytes(len(headers)))])
            columns: dict[str, Any] = ({"id": ids, "headers": headers, "body": bodies, "due": dues} if kind == "delayed"
                                       else {"id": ids, "expires": expires, "headers": headers, "body": bodies})
            copy_arrow(conn, table, pa.table(columns))
            return
        names, rows = self._rows(kind, headers.to_pylist(), bodies.to_pylist(), expires.to_pylist(), dues.to_pylist(), have)
        insert_values(conn, table, names, rows)

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


@dataclass
class LaneBatch:
    """What one batch writes when the columnar lane took part: the lane's tables, and the
    per-row lane's Outgoing rows with their places in the batch."""

    tables: list[TableColumns] = field(default_factory=list)
    outs: list[tuple[int, Outgoing]] = field(default_factory=list)


def _parts(lane: list[Any], rest: Any) -> Any:
    """A column's lane parts and the per-row lanes' part (`rest`, None when they wrote none) as
    one array, or one chunked array where there are several."""
    import pyarrow as pa

    parts = lane if rest is None else [*lane, rest]
    return parts[0] if len(parts) == 1 else pa.chunked_array(parts)


def _in_order(a: Any, order: Any) -> Any:
    """`a` (an array or a chunked array) taken in `order`, as one array."""
    from bridge.sources.columns import taken

    if hasattr(a, "num_chunks"):
        return a.take(order).combine_chunks()
    return taken(a, order)
