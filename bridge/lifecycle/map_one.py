"""`qbridge map`: what one legacy row becomes (issue 47) — its route, headers, body and TTBR, or the
skip or quarantine and the rule behind it — read and mapped as a batch would, writing nothing."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from bridge.db import read_only_engine
from bridge.errors import BridgeError, UsageError
from bridge.lifecycle.preview import QUEUE_HEAD  # rows of a proxy queue looked through for the key
from bridge.mapping_rules import MATCHED
from bridge.pipeline.loop import JobRunner
from bridge.targets.base import Skipped
from bridge.targets.envelope import Outgoing


class NotFound(BridgeError):
    """No row with that key."""


def map_one(runner: JobRunner, queue: str, key: str) -> dict[str, Any]:
    if queue not in runner.sources:
        raise UsageError(f"job {runner.job.name!r} has no queue {queue!r} (it has {', '.join(runner.sources)})")
    source = runner.sources[queue]
    engine = read_only_engine(runner.source_url)
    try:
        with engine.connect() as sconn:
            if source.cursor == "monotonic":
                if not key.isdigit():
                    raise UsageError(f"queue {queue!r} is keyed by its row id: --key takes a number, not {key!r}")
                rows = source.fetch_ranges(sconn, [(int(key), int(key))], False)
            elif source.cursor == "scan":
                rows = source.fetch_keys(sconn, [key], False)
            else:
                rows = [r for r in source.fetch_after(sconn, None, QUEUE_HEAD, False) if key in (source.ledger_key(r), str(r.key))]
    finally:
        engine.dispose()
    if not rows:
        raise NotFound(f"queue {queue!r} of job {runner.job.name!r} has no row with key {key!r} now")
    row = rows[0]
    translated: frozenset[str] = getattr(source, "translated_headers", frozenset())
    seen: list[str] = []
    token = MATCHED.set(seen)
    try:
        msg, result, reason = runner.map_row(source, row, translated)
    finally:
        MATCHED.reset(token)
    out: dict[str, Any] = {"job": runner.job.name, "queue": queue, "key": source.ledger_key(row),
                           "message_id": str(runner.message_id(source, row))}
    if msg is not None and result is not None and not isinstance(result, Skipped):  # types are mapped for what is delivered
        for t in msg.enclosed_types:
            by_rule = runner.mapping.type_rule_of(t)
            if by_rule is not None:
                seen.insert(0, f"types.rules[{by_rule}]")
    out["rules"] = list(dict.fromkeys(seen))
    if result is None:
        return {**out, "outcome": "quarantined", "reason": reason}
    if isinstance(result, Skipped):
        return {**out, "outcome": "skipped", "reason": result.reason}
    out.update(outcome="delivered", table=runner.target.ledger_target(result))
    if isinstance(result, Outgoing):
        out.update(kind=result.kind, headers=result.headers, body=_shown(result.body),
                   expires=result.expires.isoformat() if result.expires else None, due=result.due.isoformat() if result.due else None)
    return out


def _shown(body: bytes | None) -> Any:
    """JSON as JSON, other text as text, anything else as base64 (said so)."""
    if body is None:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(body).decode("ascii")}
