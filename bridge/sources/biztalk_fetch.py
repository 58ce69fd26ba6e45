"""A BizTalk batch's rows as `BizTalkSource.fetch_keys` reads them: each work-queue (or
suspended-queue) entry with its Spool row, and its message's parts with their fragments, by
message id (the leading column of each table's primary key), a few statements a batch."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from bridge.schemas.text_in import among
from bridge.sources.base import dict_rows

# A key as BizTalkSource.key_of_row spells it: queue, message id, instance id, as str(UUID) does.
_SPELLED = re.compile(r"[QS]:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:"
                      r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def uuid_text(column: sa.ColumnElement[Any], dialect: str, name: str | None = None) -> sa.ColumnElement[Any]:
    """A uuid column as a fetch or a key walk selects it, named `name` (else its own name). PostgreSQL
    spells a uuid as str(UUID) does, so its text comes from the server, no UUID made and spelled in
    Python per value (a walked key 3.2 -> 0.7 µs; a fetched entry's eight ids, issue 49). Elsewhere
    the driver's UUID: within a dialect every id of a batch is of one kind, and compares as such."""
    label = name or getattr(column, "name", None)
    if dialect == "postgresql":
        return sa.cast(column, sa.Text).label(label)
    return column if name is None else column.label(name)


def wanted_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each key as the rows' own ids spell it -> the key as given: rows are matched by text, with
    no UUID made from a key or sorted (a key spelled otherwise, in capitals say, is spelled anew)."""
    out = {}
    for key in keys:
        if _SPELLED.fullmatch(key):
            out[key] = key
        else:
            prefix, message, instance = key.split(":")
            out[f"{prefix}:{uuid.UUID(message)}:{uuid.UUID(instance)}"] = key
    return out


def entries(conn: sa.Connection, t: dict[str, sa.Table], q: sa.Table, prefix: str, wanted: dict[str, str], step: int
            ) -> dict[str, dict[str, Any]]:
    """Key -> the entry's values with its Spool row (and suspension), for the keys of queue `q`
    (`prefix` "Q" or "S") in `wanted` (`wanted_keys`), `step` ids a statement."""
    s, i = t["Spool"], t["InstancesSuspended"]
    found: dict[str, dict[str, Any]] = {}
    messages = sorted({k[2:38] for k in wanted if k[0] == prefix})
    if not messages:
        return found
    d = conn.dialect.name
    cols = [uuid_text(q.c.uidMessageID, d), uuid_text(q.c.uidInstanceID, d), uuid_text(q.c.uidServiceID, d),
            q.c.nvcAdditionalInfo, *spool_columns(s, d)]
    stmt = sa.select(*cols).select_from(q).outerjoin(s, s.c.uidMessageID == q.c.uidMessageID)
    if prefix == "S":
        stmt = stmt.add_columns(*suspension_columns(i, d)).outerjoin(i, i.c.uidInstanceID == q.c.uidInstanceID)
    for start in range(0, len(messages), step):
        chunk = stmt.where(among(q.c.uidMessageID, messages[start:start + step], d))
        for values in dict_rows(conn.execute(chunk)):
            key = wanted.get(f"{prefix}:{values['uidMessageID']}:{values['uidInstanceID']}")
            if key is not None:  # not another instance of the same message
                values["kind"] = prefix
                found[key] = values
    return found


def spool_columns(s: sa.Table, dialect: str) -> list[sa.ColumnElement[Any]]:
    """An entry's Spool columns, as the fetch and a give-back's re-read select them."""
    return [uuid_text(s.c.uidMessageID, dialect, "spool_id"), s.c.dtTimeStamp, s.c.dtExpiration, s.c.nNumParts,
            uuid_text(s.c.uidBodyPartID, dialect), s.c.nvcBodyPartName, s.c.nvcMessageType, s.c.imgContext]


def suspension_columns(i: sa.Table, dialect: str) -> list[sa.ColumnElement[Any]]:
    """A suspended entry's InstancesSuspended columns."""
    return [uuid_text(i.c.uidInstanceID, dialect, "suspended_row"), i.c.nState, i.c.dtSuspendTimeStamp, i.c.nvcURI,
            i.c.nvcAdapter, i.c.nvcErrorDescription]


def parts(conn: sa.Connection, t: dict[str, sa.Table], messages: Sequence[str], step: int = 500
          ) -> dict[str, list[dict[str, Any]]]:
    """Message id as text -> its parts by name, each with its fragments' bytes in order, for the
    message ids `messages` (as text)."""
    mp, p, f = t["MessageParts"], t["Parts"], t["Fragments"]
    out: dict[str, list[dict[str, Any]]] = {}
    dialect = conn.dialect.name
    for start in range(0, len(messages), step):
        stmt = (sa.select(uuid_text(mp.c.uidMessageID, dialect, "qb_message"), uuid_text(mp.c.uidPartID, dialect),
                          mp.c.nvcPartName, mp.c.nBodyPart, uuid_text(p.c.uidPartID, dialect, "part_row"), p.c.imgPart,
                          p.c.nNumFragments, p.c.nPartSize)
                .select_from(mp).outerjoin(p, p.c.uidPartID == mp.c.uidPartID)
                .where(among(mp.c.uidMessageID, messages[start:start + step], dialect))
                .order_by(mp.c.uidMessageID, mp.c.nvcPartName))
        by_part: dict[Any, list[dict[str, Any]]] = {}  # BizTalk shares a part between messages
        for part in dict_rows(conn.execute(stmt)):
            message = part.pop("qb_message")
            part["fragments"] = []  # fragment 0 is in Parts; the rest, if any, in Fragments
            out.setdefault(str(message), []).append(part)
            by_part.setdefault(part["uidPartID"], []).append(part)
        ids = sorted(str(p) for p in by_part)
        for at in range(0, len(ids), step):
            frags = sa.select(uuid_text(f.c.uidPartID, dialect), f.c.nFragmentNumber, f.c.imgFrag).where(among(f.c.uidPartID, ids[at:at + step], dialect))
            for pid, _, blob in conn.execute(frags.order_by(f.c.uidPartID, f.c.nFragmentNumber)):
                for part in by_part[pid]:
                    part["fragments"].append(bytes(blob) if blob is not None else None)
    return out
