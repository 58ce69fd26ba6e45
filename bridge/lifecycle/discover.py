"""`qbridge discover URL`: what a legacy database holds that qbridge can migrate (issue 28).

NGinn queue tables are recognised by their columns, OpenJMS stores by their tables
(destinations, consumers, message handles), BizTalk hosts by their `<Host>Q` and
`<Host>Q_Suspended` pair beside the Spool. Counts are exact (one grouped count per table);
message types come from a bounded sample per queue decoded by the same sources a migration uses,
and the output says how large the sample was.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from bridge.config import JobConfig
from bridge.errors import BadRow
from bridge.schemas.openjms import is_queue
from bridge.schemas.openjms import tables as openjms_tables
from bridge.sources import source_class
from bridge.sources.nginn import COLUMNS as NGINN_COLUMNS
from bridge.sources.nginn import STATES as NGINN_STATES
from bridge.sources.nginn import SUBSCRIPTION_TABLES, live_subscriptions
from bridge.timefmt import zone

SAMPLE = 200  # messages decoded per queue for the types seen
NO_TYPE = "(no type)"


@dataclass
class FoundQueue:
    system: str
    name: str  # what a job's `queues` lists: table, destination or host
    kind: str  # "queue", "topic" (OpenJMS) or "host" (BizTalk)
    states: dict[str, int] = field(default_factory=dict)  # rows by legacy state
    consumers: list[str] = field(default_factory=list)  # a topic's durable consumers
    types: dict[str, int] = field(default_factory=dict)  # message types in the sample, with counts
    sampled: int = 0
    unreadable: int = 0  # in the sample: rows a migration would quarantine

    @property
    def pending(self) -> int:
        return sum(n for s, n in self.states.items() if s not in ("processed",))


@dataclass
class Discovery:
    where: str  # the URL without its password
    schema: str | None
    sample: int
    queues: list[FoundQueue] = field(default_factory=list)
    subscriptions: list[dict[str, str]] = field(default_factory=list)  # NGinn: subscriber queue and message type

    def to_json(self) -> dict[str, Any]:
        return {"where": self.where, "schema": self.schema, "sample": self.sample,
                "queues": [{**asdict(q), "pending": q.pending} for q in self.queues], "subscriptions": self.subscriptions}


def discover(engine: sa.Engine, schema: str | None = None, sample: int = SAMPLE) -> Discovery:
    found = Discovery(engine.url.render_as_string(hide_password=True), schema, sample)
    with engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names(schema=schema))
        found.queues += _nginn(conn, names, schema)
        if NGINN_SUBSCRIPTIONS & names:
            found.subscriptions = [{"endpoint": s.endpoint, "topic": s.topic}
                                   for s in live_subscriptions(conn, schema, zone("UTC"))]
        if OPENJMS_TABLES <= names:
            found.queues += _openjms(conn, schema)
        found.queues += _biztalk(conn, names, schema)
        for q in found.queues:
            _sample_types(engine, conn, schema, q, sample)
    return found


NGINN_SUBSCRIPTIONS = set(SUBSCRIPTION_TABLES)
OPENJMS_TABLES = {"destinations", "consumers", "message_handles", "messages"}


def _nginn(conn: sa.Connection, names: set[str], schema: str | None) -> list[FoundQueue]:
    out = []
    insp = sa.inspect(conn)
    for name in sorted(names):
        columns = {c["name"].lower() for c in insp.get_columns(name, schema=schema)}
        if not set(NGINN_COLUMNS) <= columns:
            continue
        t = sa.table(name, sa.column("subqueue"), schema=schema)
        counts = conn.execute(sa.select(t.c.subqueue, sa.func.count()).group_by(t.c.subqueue)).all()
        states = Counter({NGINN_STATES.get((s or "").strip(), f"subqueue {s!r}"): n for s, n in counts})
        out.append(FoundQueue("nginn", name, "queue", dict(states)))
    return out


def _openjms(conn: sa.Connection, schema: str | None) -> list[FoundQueue]:
    t = openjms_tables(schema)
    d, c, h = t["destinations"], t["consumers"], t["message_handles"]
    pending: dict[int, int] = dict(conn.execute(sa.select(h.c.destinationid, sa.func.count()).group_by(h.c.destinationid)).all())
    consumers: dict[int, list[str]] = {}
    for did, name in conn.execute(sa.select(c.c.destinationid, c.c.name).order_by(c.c.name)):
        consumers.setdefault(did, []).append(name)
    out = []
    for name, did, isqueue in conn.execute(sa.select(d.c.name, d.c.destinationid, d.c.isqueue).order_by(d.c.name)):
        queue = is_queue(isqueue)
        out.append(FoundQueue("openjms", name, "queue" if queue else "topic", {"ready": pending.get(did, 0)},
                              [] if queue else consumers.get(did, [])))
    return out


def _biztalk(conn: sa.Connection, names: set[str], schema: str | None) -> list[FoundQueue]:
    if "Spool" not in names:
        return []
    out = []
    for name in sorted(names):
        host = name[:-1]
        if not name.endswith("Q") or f"{name}_Suspended" not in names or not host:
            continue
        work, suspended = (conn.execute(sa.select(sa.func.count()).select_from(sa.table(n, schema=schema))).scalar_one()
                           for n in (name, f"{name}_Suspended"))
        out.append(FoundQueue("biztalk", host, "host", {"ready": work, "suspended": suspended}))
    return out


def _sample_types(engine: sa.Engine, conn: sa.Connection, schema: str | None, q: FoundQueue, sample: int) -> None:
    """The types of the first `sample` messages of `q`, decoded as a migration would."""
    job = JobConfig.model_validate({
        "name": "discover", "mapping": "-", "source": {"system": q.system, "connection": "legacy", "queues": [q.name],
                                                       "timezone": "UTC", "schema": schema, "database": "discover"},
        "target": {"connection": "nsb", "flavor": "postgresql"}})
    source = source_class(q.system)(job, engine, q.name, "discover")
    if source.cursor == "monotonic":
        rows = source.fetch_after(conn, None, sample, False)
    else:
        rows = source.fetch_keys(conn, list(itertools.islice(source.iter_keys(conn), sample)), False)
    types: Counter[str] = Counter()
    for row in rows:
        try:
            msg = source.decode(row)
        except BadRow:
            q.unreadable += 1
            continue
        except Exception:  # noqa: BLE001 - a row discover cannot read is what preview will quarantine
            q.unreadable += 1
            continue
        types.update(msg.enclosed_types or [NO_TYPE])
    q.sampled = len(rows)
    q.types = dict(types.most_common())
