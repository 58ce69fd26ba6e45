"""`qbridge verify --deep`: every delivered message still in the target compared, by a content
hash, with what its source row makes today.

The target side is streamed once per table this job delivered into (message id -> hash of the
body and headers). The source side re-reads each delivered row in batches and runs it through
the same decode and envelope as a pass. Rows an endpoint has already consumed cannot be
compared and are counted apart. `NServiceBus.TimeOfFailure` is left out of the hash: for
messages the legacy side never recorded a failure time for, it is the moment qbridge read them.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

from bridge.errors import BadRow
from bridge.pipeline.loop import JobRunner
from bridge.targets.envelope import Outgoing, envelope

VOLATILE = frozenset({"NServiceBus.TimeOfFailure"})
BATCH = 500


@dataclass
class DeepBooks:
    compared: int = 0
    matched: int = 0
    mismatched: int = 0
    consumed: int = 0  # delivered, then taken off the target queue by an endpoint: nothing to compare
    mismatched_keys: list[str] = field(default_factory=list)


def digest(headers: dict[str, str], body: bytes | None) -> bytes:
    kept = {k: v for k, v in headers.items() if k not in VOLATILE}
    h = hashlib.sha256(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS))
    h.update(b"\0" if body is None else b"\1" + body)
    return h.digest()


def _target_digests(runner: JobRunner, tconn: sa.Connection, tables: set[str]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name in sorted(tables):
        table = runner.tables.delayed(name[: -len(".Delayed")]) if name.endswith(".Delayed") else runner.tables.queue(name)
        headers_col, body_col = runner.tables.column(table, "Headers"), runner.tables.column(table, "Body")
        stmt = sa.select(headers_col, body_col)
        for headers, body in tconn.execute(stmt.execution_options(stream_results=True, yield_per=2000)):
            parsed = orjson.loads(headers)
            mid = parsed.get("NServiceBus.MessageId")
            if mid:
                out[mid] = digest(parsed, bytes(body) if body is not None else None)
    return out


def deep_compare(runner: JobRunner) -> dict[str, DeepBooks]:
    """Per queue of the job: delivered messages compared with their source rows."""
    job = runner.job.name
    ledger = runner.state.ledger
    books: dict[str, DeepBooks] = {q: DeepBooks() for q in runner.sources}
    with runner.target_engine.connect() as tconn, runner.source_engine.connect() as sconn:
        delivered: dict[str, list[tuple[str, str]]] = defaultdict(list)
        targets: set[str] = set()
        stmt = sa.select(ledger.c.queue, ledger.c.source_key, ledger.c.message_id, ledger.c.target).where(
            ledger.c.origin.in_(list(runner.origins.values())), ledger.c.job == job, ledger.c.outcome == "delivered")
        for queue, key, mid, target in tconn.execute(stmt):
            if queue in books:
                delivered[queue].append((key, mid))
                targets.add(target)
        in_target = _target_digests(runner, tconn, targets)
        for queue, entries in delivered.items():
            source = runner.sources[queue]
            b = books[queue]
            translated = getattr(source, "translated_headers", frozenset())
            for start in range(0, len(entries), BATCH):
                chunk = entries[start:start + BATCH]
                rows = _fetch(source, sconn, [k for k, _ in chunk])
                for key, mid in chunk:
                    expected = in_target.get(mid)
                    if expected is None:
                        b.consumed += 1
                        continue
                    b.compared += 1
                    row = rows.get(key)
                    now = _recompute(source, row, runner, translated) if row is not None else None
                    if now is not None and now == expected:
                        b.matched += 1
                    else:
                        b.mismatched += 1
                        if len(b.mismatched_keys) < 20:
                            b.mismatched_keys.append(key if row is not None else f"{key} (no longer in the source)")
    return books


def _fetch(source: Any, sconn: sa.Connection, keys: list[str]) -> dict[str, Any]:
    if source.cursor == "scan":
        found = source.fetch_keys(sconn, keys, False)
    else:
        ints = sorted(int(k) for k in keys)
        found = source.fetch_ranges(sconn, [(k, k) for k in ints], False)
    return {str(r.key): r for r in found}


def _recompute(source: Any, row: Any, runner: JobRunner, translated: frozenset[str]) -> bytes | None:
    try:
        result = envelope(source.decode(row), runner.mapping, runner.tables, runner.job.target, translated)
    except BadRow:
        return None
    if not isinstance(result, Outgoing):
        return None  # skipped now (an expiry passed since delivery, or the mapping changed)
    return digest(result.headers, result.body)
