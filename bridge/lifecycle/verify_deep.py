"""`qbridge verify --deep`: every delivered message still in the target compared, by a content
hash, with what its source row makes today.

The target side is streamed once per table this job delivered into (message id -> hash of the
body and headers). The source side re-reads each delivered row in batches and runs it through
the same decode and envelope as a pass. Rows an endpoint has already consumed cannot be
compared and are counted apart. `NServiceBus.TimeOfFailure` is left out of the hash: for
messages the legacy side never recorded a failure time for, it is the moment qbridge read them.
So are the headers a source added later for a move-mode rollback to rebuild its rows from
(`Source.added_headers`): a message delivered before carries none, and the fields they repeat
are in the hash through the headers it does carry.
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

VOLATILE = frozenset({"NServiceBus.TimeOfFailure", "traceparent"})  # the time it failed; the batch span that wrote it
BATCH = 500


@dataclass
class DeepBooks:
    compared: int = 0
    matched: int = 0
    mismatched: int = 0
    consumed: int = 0  # delivered, then taken off the target queue by an endpoint: nothing to compare
    moved: int = 0  # move mode consumed its legacy row (gone, or NGinn's 'X'): nothing left to compare with
    impure: int = 0  # of the mismatched: mapped twice today, they came out different (a plugin that is not pure)
    mismatched_keys: list[str] = field(default_factory=list)


def digest(headers: dict[str, str], body: bytes | None, skipped: frozenset[str] = VOLATILE) -> bytes:
    kept = {k: v for k, v in headers.items() if k not in skipped}
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
                out[mid] = digest(parsed, bytes(body) if body is not None else None, skipped(runner))
    return out


def deep_compare(runner: JobRunner) -> dict[str, DeepBooks]:
    """Per queue of the job: delivered messages compared with their source rows."""
    books: dict[str, DeepBooks] = {q: DeepBooks() for q in runner.sources}
    move = runner.job.mode == "move"
    with runner.target_engine.connect() as tconn, runner.source_engine.connect() as sconn:
        # queue -> (key, message id, what its source row makes today: a digest, None, or GONE)
        recomputed: dict[str, list[tuple[str, str, Any]]] = defaultdict(list)
        targets: set[str] = set()
        for queue, entries in _delivered(runner, tconn).items():
            source = runner.sources[queue]
            translated: frozenset[str] = getattr(source, "translated_headers", frozenset())
            for start in range(0, len(entries), BATCH):
                chunk = entries[start:start + BATCH]
                rows = _fetch(source, sconn, [k for k, _, _ in chunk])
                for key, mid, target in chunk:
                    row = rows.get(key)
                    if move and (row is None or row.values.get("subqueue") == "X"):
                        # The row this job consumed says what it became, not what it was: a
                        # processed row maps to a skip, and a deleted one to nothing.
                        books[queue].moved += 1
                        continue
                    now, where = _recompute(source, row, runner, translated) if row is not None else (GONE, None)
                    # A range keeps no target: the row mapped again says where it went.
                    targets.update(t for t in (target, where) if t)
                    recomputed[queue].append((key, mid, now))
        if any(s.cursor == "monotonic" for s in runner.sources.values()):
            # A range keeps no target, and a row that no longer maps (gone from the source, or
            # unreadable now) names none: read every table the job's messages can go to, lest
            # a message still there be counted as consumed.
            targets |= _possible_targets(runner, tconn)
        in_target = _target_digests(runner, tconn, targets)
        for queue, entries in recomputed.items():
            b = books[queue]
            for key, mid, now in entries:
                expected = in_target.get(mid)
                if expected is None:
                    b.consumed += 1
                    continue
                b.compared += 1
                if now == expected:
                    b.matched += 1
                else:
                    b.mismatched += 1
                    b.impure += now is IMPURE
                    if len(b.mismatched_keys) < 20:
                        b.mismatched_keys.append(f"{key} (no longer in the source)" if now is GONE else
                                                 f"{key} (mapped twice, it came out different: a [[transforms]] plugin "
                                                 "that is not pure)" if now is IMPURE else key)
    return books


GONE = object()  # a delivered message's source row that is no longer there
IMPURE = object()  # a row the mapping's plugins make differently each time


def _possible_targets(runner: JobRunner, tconn: sa.Connection) -> set[str]:
    """The tables (as the ledger names them) a message of the job can go to, of those that exist."""
    queues = set(runner.mapping.target_queues())
    names = queues | {f"{q}.Delayed" for q in queues} | {runner.job.target.error_queue, runner.job.target.audit_queue}
    insp = sa.inspect(tconn)
    out = set()
    for name in names:
        table = runner.tables.delayed(name[: -len(".Delayed")]) if name.endswith(".Delayed") else runner.tables.queue(name)
        if insp.has_table(table.name, schema=table.schema):
            out.add(name)
    return out


def _delivered(runner: JobRunner, tconn: sa.Connection) -> dict[str, list[tuple[str, str, str | None]]]:
    """queue -> (key, message id, target or None) of the job's delivered messages."""
    return {queue: runner.delivered(tconn, queue) for queue in runner.sources}


def _fetch(source: Any, sconn: sa.Connection, keys: list[str]) -> dict[str, Any]:
    if source.cursor == "scan":
        found = source.fetch_keys(sconn, keys, False)
    else:
        ints = sorted(int(k) for k in keys)
        found = source.fetch_ranges(sconn, [(k, k) for k in ints], False)
    return {str(r.key): r for r in found}


def _recompute(source: Any, row: Any, runner: JobRunner, translated: frozenset[str]) -> tuple[Any, str | None]:
    """(the digest of what the row makes today, the table it goes to); (None, None) when it is
    not delivered today (unreadable, or skipped now: an expiry passed, or the mapping changed).
    With plugins, the row is mapped twice: IMPURE when the two differ."""
    made = []
    for _ in range(2 if runner.mapping.transforms else 1):
        try:
            result = envelope(source.decode(row), runner.mapping, runner.tables, runner.job.target, translated)
        except BadRow:
            return None, None
        if not isinstance(result, Outgoing):
            return None, None
        made.append(digest(result.headers, result.body, skipped(runner)))
    return (IMPURE if len(set(made)) > 1 else made[0]), runner.target.ledger_target(result)


def skipped(runner: JobRunner) -> frozenset[str]:
    """Headers left out of the hash, under the names the job's mapping gives them."""
    memo = runner.__dict__.get("_deep_skipped")
    if memo is None:
        added = {runner.mapping.header_target(h, frozenset()) for s in runner.sources.values() for h in s.added_headers()}
        memo = runner.__dict__["_deep_skipped"] = VOLATILE | frozenset(h for h in added if h)
    return memo
