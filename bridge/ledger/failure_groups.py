"""Quarantined messages in groups (issue 38), as ServiceControl groups failed messages: one
group per job, queue and reason with its varying parts masked, so that one bad mapping rule
that quarantined 10,000 messages is one line to read and one group to replay.

A group is named by a short hash of (job, queue, masked reason), kept in a column of the
quarantine row beside an index: listing groups is one GROUP BY over that index, and nothing
else is stored (bounded by the quarantine itself)."""

from __future__ import annotations

import hashlib
import re

GROUP_LENGTH = 12  # hex digits of the group's name

# The order matters: quoted values and whole ids first, so that their digits are not numbers.
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"'(?:[^'\\]|\\.)*'"), "'…'"),
    (re.compile(r'"(?:[^"\\]|\\.)*"'), '"…"'),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,:]\d+)?)?)?(?:\s?(?:Z|UTC|[+-]\d{2}:?\d{2}))?"), "<time>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\bID:[\w.:-]+"), "<id>"),  # JMS message ids
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<n>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
    (re.compile(r"\b[0-9a-fA-F]{16,}\b"), "<hex>"),
)


def masked(reason: str) -> str:
    """The reason with what varies from message to message masked: quoted values, ids,
    numbers and timestamps."""
    text = reason.strip().splitlines()[0] if reason.strip() else ""
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return text[:300]


def group_of(job: str, queue: str, reason: str) -> str:
    """The group's name: the same for every message of the job's queue quarantined for the
    same reason, whatever its ids, numbers and values."""
    key = f"{job}\x00{queue}\x00{masked(reason)}".encode()
    return hashlib.sha1(key, usedforsecurity=False).hexdigest()[:GROUP_LENGTH]
