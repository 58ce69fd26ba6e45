"""The echo guard: a message never goes back into the queue it came from.

Every message qbridge writes carries `QBridge.Source` = `system://database/queue/key`. A job of
either direction that would deliver a message into the very system and queue named there
skips it instead (counted, with the reason), so a forward and a reverse job on the same queue
pair cannot bounce a message between the two worlds.
"""

from __future__ import annotations

ECHO_HEADER = "QBridge.Source"


def source_tag(system: str, database: str, queue: str, key: str) -> str:
    return f"{system}://{database}/{queue}/{key}"


def echo_of(tag: str | None, system: str, queue: str, database: str | None = None) -> str | None:
    """The skip reason when `tag` says the message came from `system` `queue` (in `database`,
    when given), else None. Queue names may hold '/', so the key is the last segment."""
    if not tag or not tag.startswith(f"{system}://"):
        return None
    rest = tag[len(system) + 3:]
    db, sep, path = rest.partition("/")
    came_from, _, _key = path.rpartition("/")
    if not sep or came_from != queue or (database is not None and db != database):
        return None
    return f"echo: the message came from {system} queue {queue!r} ({tag}); it is not sent back there"
