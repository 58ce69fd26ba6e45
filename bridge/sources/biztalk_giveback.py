"""A BizTalk work-queue (or suspended-queue) entry a move-mode rollback gives back.

Move mode deleted the entry only; the message stays in Spool, MessageParts, Parts and Fragments
(and a suspended instance in InstancesSuspended) until BizTalk's cleanup purges messages no
queue refers to. So giving it back re-inserts the entry, with the service it was routed to and
its additional info as the delivered row carries them (`BizTalk.ServiceID`,
`BizTalk.AdditionalInfo`), while the message is still there. The message as it is then read
(the row `fetch_keys` would have read) goes with what is owed: if BizTalk purges it before the
give-back, it is quarantined as it was, and `quarantine replay` delivers it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from bridge.sources import biztalk_fetch
from bridge.sources.base import SourceRow, delivered_headers

STATEMENT_KEYS = 500


def rebuild(source: Any, conn: sa.Connection, key: str, delivered: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """("owed", the entry to re-insert and the message as it is now) or ("unsure", None) when
    the delivered row does not say which service the entry was for (delivered by a qbridge
    before it carried that), or the message is gone from the MessageBox already."""
    h = delivered_headers(delivered["headers"], source.mapping)
    if "BizTalk.ServiceID" not in h:
        return "unsure", None
    values = message_values(source, conn, key, h["BizTalk.ServiceID"] or None, h.get("BizTalk.AdditionalInfo"))
    if values is None:
        return "unsure", None
    return "owed", {"service": h["BizTalk.ServiceID"] or None, "info": h.get("BizTalk.AdditionalInfo"),
                    "raw": source.raw(SourceRow(key=key, consumable=True, values=values))}


def message_values(source: Any, conn: sa.Connection, key: str, service: str | None, info: str | None
                   ) -> dict[str, Any] | None:
    """The row `fetch_keys` reads for `key`, from the message's Spool row and parts (and its
    InstancesSuspended row), its queue entry being gone; None when the message is gone too."""
    prefix, message, instance = source._split(key)
    s, i = source.t["Spool"], source.t["InstancesSuspended"]
    d = conn.dialect.name
    stmt = sa.select(*biztalk_fetch.spool_columns(s, d)).where(s.c.uidMessageID == message)
    spool = conn.execute(stmt).mappings().first()
    if spool is None:
        return None
    values = {"uidMessageID": message, "uidInstanceID": instance, "uidServiceID": service, "nvcAdditionalInfo": info,
              **{str(k): v for k, v in spool.items()}, "kind": prefix}
    if prefix == "S":
        suspended = conn.execute(sa.select(*biztalk_fetch.suspension_columns(i, d))
                                 .where(i.c.uidInstanceID == instance)).mappings().first()
        if suspended is None:
            return None
        values.update({str(k): v for k, v in suspended.items()})
    values["parts"] = biztalk_fetch.parts(conn, source.t, [str(message)]).get(str(message), [])
    return values


def give_back(source: Any, conn: sa.Connection, owed: Sequence[Any]) -> tuple[list[str], int]:
    """Re-inserts each owed entry whose message (and suspended instance) is still there and
    that is not in its queue already; the others' keys come back as gone."""
    split = {o.key: source._split(o.key) for o in owed}
    s, i = source.t["Spool"], source.t["InstancesSuspended"]
    messages = sorted({m for _, m, _ in split.values()})
    instances = sorted({n for p, _, n in split.values() if p == "S"})
    spooled: set[uuid.UUID] = set()
    suspended: set[uuid.UUID] = set()
    queued: set[tuple[str, uuid.UUID, uuid.UUID]] = set()
    for start in range(0, len(messages), STATEMENT_KEYS):
        chunk = messages[start:start + STATEMENT_KEYS]
        # Locked: a purge of the message waits for the entry given back, or is seen to have been.
        spooled.update(conn.execute(sa.select(s.c.uidMessageID).where(s.c.uidMessageID.in_(chunk)).with_for_update()
                                    .with_hint(s, "WITH (UPDLOCK, ROWLOCK)", "mssql")).scalars())
        for prefix, q in (("Q", source.work), ("S", source.suspended)):
            queued.update((prefix, m, n) for m, n in conn.execute(
                sa.select(q.c.uidMessageID, q.c.uidInstanceID).where(q.c.uidMessageID.in_(chunk))))
    for start in range(0, len(instances), STATEMENT_KEYS):
        suspended.update(conn.execute(sa.select(i.c.uidInstanceID)
                                      .where(i.c.uidInstanceID.in_(instances[start:start + STATEMENT_KEYS]))).scalars())
    gone: list[str] = []
    rows: dict[str, list[dict[str, Any]]] = {"Q": [], "S": []}
    for o in owed:
        prefix, message, instance = split[o.key]
        if message not in spooled or (prefix == "S" and instance not in suspended):
            gone.append(o.key)
        elif (prefix, message, instance) not in queued:
            service = o.payload["service"]
            rows[prefix].append({"uidMessageID": message, "uidInstanceID": instance,
                                 "uidServiceID": uuid.UUID(service) if service else None,
                                 "nvcAdditionalInfo": o.payload["info"]})
    for prefix, q in (("Q", source.work), ("S", source.suspended)):
        if rows[prefix]:
            conn.execute(sa.insert(q), rows[prefix])
    return gone, len(rows["Q"]) + len(rows["S"])
