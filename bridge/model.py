"""The canonical message: what every source produces and every target consumes."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Annotated, Literal, NamedTuple

from pydantic import AwareDatetime as PydanticAwareDatetime
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

State = Literal["ready", "delayed", "failed", "processed", "expired"]
Intent = Literal["Send", "Publish", "Reply"]

# Every source message gets the same id on every run: it keys the ledger and becomes
# NServiceBus.MessageId, so Outbox endpoints de-duplicate too.
# The longest source key the ledger holds (its source_key column); a longer one is kept as its
# digest (ledger_safe_key).
LEDGER_KEY_MAX = 200


def pending_key(key: object) -> object:
    """A source key as it compares after a trip through JSON (the checkpoint's pending list,
    qbridge_inflight): tuples become lists, and back."""
    return tuple(key) if isinstance(key, list | tuple) else key
MESSAGE_ID_NAMESPACE = uuid.UUID("4f1c2a7e-9b3d-5c8e-a1f0-6d2b7e9c3a51")


# Checked by pydantic-core itself (no Python call per field): a naive timestamp is an error.
AwareDatetime = PydanticAwareDatetime
NonEmpty = Annotated[str, StringConstraints(min_length=1)]


_NAMESPACE_BYTES = MESSAGE_ID_NAMESPACE.bytes


def message_id_for(system: str, database: str, queue: str, key: str) -> uuid.UUID:
    """Deterministic id of one source message (UUIDv5 over its coordinates)."""
    return uuid.UUID(message_ids(system, database, queue, (key,))[0])


_UUID_NEW, _SET = object.__new__, object.__setattr__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


def message_ids(system: str, database: str, queue: str, keys: Sequence[str]) -> list[str]:
    """The text of the deterministic ids (UUIDv5 over their coordinates) of many keys of one queue,
    as the ledger and NServiceBus.MessageId hold them: the queue's prefix is hashed once, and the
    id is cut out of the digest's hex, its version and variant set by character (no uuid.UUID,
    no integer arithmetic: 1.12 -> 0.72 us a key; tested equal to uuid.uuid5)."""
    base = hashlib.sha1(_NAMESPACE_BYTES + f"{system}/{database}/{queue}/".encode())
    variant = _VARIANT_HEX
    texts: list[str] = []
    append = texts.append
    for key in keys:
        h = base.copy()
        h.update(key.encode())
        x = h.hexdigest()
        append(f"{x[:8]}-{x[8:12]}-5{x[13:16]}-{variant[x[16]]}{x[17:20]}-{x[20:32]}")
    return texts


# RFC 4122's variant: the top two bits of byte 8 are 10, so its first hex digit is 8, 9, a or b.
_VARIANT_HEX = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def queue_origin(system: str, database: str, queue: str) -> int:
    """The ledger's name for one source queue: a signed 64-bit number hashed from the same
    coordinates as its messages' ids, without the key. The ledger is keyed by (origin, source
    key), so a batch's entries land side by side in its index where hashed message ids scatter
    them over every page; the uniqueness is the message id's own (job is in neither)."""
    digest = hashlib.sha1(_NAMESPACE_BYTES + f"{system}/{database}/{queue}/".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _uuid(number: int) -> uuid.UUID:
    """uuid.UUID(int=number) without its argument checks (the callers make valid numbers)."""
    u = _UUID_NEW(uuid.UUID)
    _SET(u, "int", number)
    _SET(u, "is_safe", _SAFE_UNKNOWN)
    return u


_VERSION_7_BITS = (7 << 76) | (0x8000 << 48)
_COUNTER_BITS = 20


def row_ids(n: int) -> list[uuid.UUID]:
    """`n` fresh ids for transport rows, unique and growing with time: UUIDv7 (RFC 9562), 48 bits
    of Unix milliseconds, then random bits whose last 20 count up within the call. The
    PostgreSQL transport's primary key is the row id: growing ids insert at the right edge of
    its index, where random ones (the transport's own Guid.NewGuid, or a hashed message id)
    land on any of its pages (a probe removed since, results in commit 8ded171 and docs/benchmarks.md: 1M rows in batches, 11.1 s with hashed ids, 7.6 s)."""
    out: list[uuid.UUID] = []
    for start, count in _bases(n):
        out.extend(_uuid(start + i) for i in range(count))
    return out


def row_id_bytes(n: int) -> bytes:
    """row_ids(n) as 16 big-endian bytes each, end to end (a binary COPY's uuid column), made by
    numpy rather than as a UUID a row. The counter lives in the low 20 bits of the low 64, so
    a row's low word is its base's plus its place: no carry reaches the high word."""
    import numpy as np

    out = np.empty((n, 2), dtype=">u8")
    at = 0
    for base, count in _bases(n):
        out[at:at + count, 0] = base >> 64
        out[at:at + count, 1] = np.arange(count, dtype=np.uint64) + np.uint64(base & _LOW_64)
        at += count
    return out.tobytes()


_LOW_64 = (1 << 64) - 1


def _bases(n: int) -> Iterator[tuple[int, int]]:
    """(first id as a number, how many follow it) covering `n` ids: a fresh time and random base
    per 2**20 ids, whose last 20 bits count up."""
    step = 1 << _COUNTER_BITS
    for start in range(0, n, step):
        base = ((time.time_ns() // 1_000_000) << 80 | _VERSION_7_BITS | secrets.randbits(12) << 64
                | secrets.randbits(62 - _COUNTER_BITS) << _COUNTER_BITS)
        yield base, min(step, n - start)


class SourceRef(BaseModel):
    """Where a message came from: enough to find the legacy row again."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    system: NonEmpty
    database: NonEmpty
    queue: NonEmpty
    key: NonEmpty


class Failure(BaseModel):
    """Why the legacy system gave up on a message."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    exception_type: NonEmpty
    message: str
    stack_trace: str
    failed_queue: NonEmpty
    time_of_failure: AwareDatetime
    inner_exception_type: str | None = None


class Part(BaseModel):
    """An extra message part (multi-part legacy messages)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: NonEmpty
    content_type: str | None = None
    body: bytes


class CanonicalMessage(BaseModel):
    """One legacy message, independent of the system it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    message_id: uuid.UUID
    source: SourceRef
    state: State
    destination: NonEmpty
    reply_to: NonEmpty | None = None
    correlation_id: NonEmpty | None = None
    conversation_id: NonEmpty | None = None
    enclosed_types: list[NonEmpty] = Field(default_factory=list)
    content_type: NonEmpty | None = None
    intent: Intent = "Send"
    time_sent: AwareDatetime
    due: AwareDatetime | None = None
    expires: AwareDatetime | None = None
    priority: int | None = None
    retry_count: int = Field(default=0, ge=0)
    failure: Failure | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    body: bytes | None = None
    parts: list[Part] = Field(default_factory=list)


MESSAGE_MAX = 16384  # NServiceBus truncates ExceptionInfo.Message to this many characters


class FailureInfo(NamedTuple):
    """`Failure`'s fields, for the fast lane: made only from values checked as `Failure` would."""

    exception_type: str
    message: str
    stack_trace: str
    failed_queue: str
    time_of_failure: datetime  # aware
    inner_exception_type: str | None = None


class PlainMessage(NamedTuple):
    """A message waiting, waiting for its due time, failed or already processed, with no expiry
    or parts: the common cases, handed from a source to a target without building a
    CanonicalMessage (the fast lane, see `Source.plain`). A source makes one only from values it
    has checked itself; anything unusual stays on the validated path."""

    state: Literal["ready", "delayed", "failed", "processed"]
    message_id: str  # the deterministic id's text, which the loop has made already
    system: str
    database: str
    queue: str
    key: str
    destination: str
    reply_to: str | None
    correlation_id: str | None
    enclosed_types: list[str]
    content_type: str | None
    time_sent: datetime  # aware
    due: datetime | None  # aware; set when delayed
    headers: dict[str, str]
    body: bytes
    failure: FailureInfo | None = None  # set when failed
    priority: int | None = None  # the legacy priority, when the system has one (OpenJMS)
    conversation_id: str | None = None  # when the legacy system names one (BizTalk's interchange)


_LONE = re.compile("[\ud800-\udfff]")


def ledger_safe_key(key: str) -> str:
    """`key` itself, or a digest of it when it is longer than the ledger's key column takes or
    holds what a text column may refuse, a NUL or a lone surrogate (an NServiceBus.MessageId is
    any text the sender chose): the same key always maps alike."""
    if len(key) <= LEDGER_KEY_MAX and "\x00" not in key and (key.isascii() or not _LONE.search(key)):
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
