"""What the reshaping rules of a mapping do to a message on its way to NServiceBus (issue 47), after
[headers] made its headers: `[[body]]`, then `[[headers.rules]]`, then `[[ttbr]]`, then the
plugins of `[[transforms]]`, each in file order and only where its `when` holds (over the message
as read, bridge.mapping_rules). A rule that cannot apply to a message (a body rule on a body that
is not JSON, a header from a body field that is not a scalar, a plugin that raises) quarantines
that message, naming the rule; the messages beside it go on."""

from __future__ import annotations

import copy
import fnmatch
import functools
import re
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

import orjson

from bridge.codecs.xmljson import xml_to_json
from bridge.errors import BadRow
from bridge.mapping import Mapping, render_template
from bridge.mapping_rules import BodyRule, MessageFacts, compiled, matched, parse_timespan
from bridge.targets.base import Skipped
from bridge.timefmt import timespan, utcnow

TTBR = "NServiceBus.TimeToBeReceived"
# Set while the columnar lane runs a group's example (bridge.targets.lane_rules): which of each
# header rule's `from_body` fields the group's rows have, as {(rule index, item index): bool}.
EXAMPLE: ContextVar[dict[tuple[int, int], bool] | None] = ContextVar("qbridge_lane_example", default=None)
CONTENT_TYPE = "NServiceBus.ContentType"
_NOTHING = object()
# The text a columnar lane example's stand-in times start with as wire times (year 1: no real
# time has it; bridge.sources.columns.SENT, DUE, FAILED), which each row's own time replaces.
_STAND_IN = "0001-01-01 00:00:00:00000"


class GiveBack(Exception):
    """A group's example met what only each row's own values decide: the lane gives its rows to the per-row lanes."""


class Reshaped:
    """A message's headers, body and expiry, as the rules leave them."""

    __slots__ = ("body", "expires", "headers")

    def __init__(self, headers: dict[str, str], body: bytes | None, expires: datetime | None) -> None:
        self.headers, self.body, self.expires = headers, body, expires


def reshape(mapping: Mapping, facts: MessageFacts, out: Reshaped, values: dict[str, str], queued: bool, state: str,
            queue: str) -> Skipped | None:
    """Applies the rules to `out` in place; Skipped when a plugin skips the message. `values`:
    the message's coordinates for header templates; `queued`: it goes to its routed queue (the
    only place a TTBR applies: delayed, error and audit rows never expire)."""
    example = EXAMPLE.get()  # a columnar lane group's example: its rows' bodies are the lane's (body_of_row)
    doc: Any = _NOTHING
    changed = False  # a body rule applied: the body is written again (else its bytes go as they are)
    for i, rule in enumerate(mapping.body):
        if not _holds(rule, facts, f"body[{i}]"):
            continue
        if rule.xml == "keep":
            out.headers.setdefault(CONTENT_TYPE, "text/xml")
            continue
        if example is not None:
            if rule.xml == "json":
                raise GiveBack
            continue
        if rule.xml == "json" and not changed:
            try:
                doc = xml_to_json(out.body or b"")
            except ValueError as e:
                raise BadRow(f"body[{i}] (xml = \"json\"): {e}") from None
            out.headers[CONTENT_TYPE] = "application/json"
        elif doc is _NOTHING:
            doc = _parsed(out.body, f"body[{i}]")
        doc, changed = _body(rule, doc, out.body), True
    for i, hrule in enumerate(mapping.header_rules):
        if not _holds(hrule, facts, f"headers.rules[{i}]"):
            continue
        h = out.headers
        for old, new in hrule.rename.items():
            if old in h:
                h[new] = h.pop(old)
        for pattern in hrule.drop:
            for name in [n for n in h if fnmatch.fnmatchcase(n, pattern)]:
                del h[name]
        for name, template in hrule.set.items():
            h[name] = render_template(template, values, h)
        for j, (name, path) in enumerate(hrule.from_body.items()):
            if example is not None:  # the lane read the row's field: a marker where it has one
                if example[(i, j)]:
                    h[name] = f"\x00B{i}_{j}\x00"  # bridge.sources.columns.mark(f"B{i}_{j}")
                continue
            if doc is _NOTHING:
                doc = _parsed(out.body, f"headers.rules[{i}].from_body")
            value = header_from_body(doc, path, i, name)
            if value is not None:
                h[name] = value
        for name, (pattern, replacement) in hrule.replace.items():
            if name in h:
                if example is not None and ("\x00" in h[name] or _STAND_IN in h[name]):
                    raise GiveBack  # a value of each row's own (a marker, a stand-in time): the per-row lanes replace in it
                h[name] = re.sub(pattern, replacement, h[name])
    if queued:
        for i, trule in enumerate(mapping.ttbr):
            if _holds(trule, facts, f"ttbr[{i}]"):
                if trule.set == "none":
                    out.expires = None
                    out.headers.pop(TTBR, None)
                elif trule.set != "keep":
                    span, text = _span(trule.set)
                    out.expires = utcnow() + span
                    out.headers[TTBR] = text
                break
    if changed:
        out.body = orjson.dumps(doc)
    return _transforms(mapping, facts, out, state, queue) if mapping.transforms else None


@functools.lru_cache(maxsize=256)
def _span(text: str) -> tuple[timedelta, str]:
    span = parse_timespan(text)
    return span, timespan(span)


def _holds(rule: Any, facts: MessageFacts, label: str) -> bool:
    when = compiled(rule)
    if when is None or when.matches(facts):
        matched(label)
        return True
    return False


def header_from_body(doc: Any, path: str, i: int, name: str) -> str | None:
    """`headers.rules[i].from_body`'s header `name`: the text of body field `path` (None: absent)."""
    value = _get(doc, path)
    if value is _NOTHING:
        return None
    if isinstance(value, (dict, list)) or value is None:
        raise BadRow(f"headers.rules[{i}].from_body {name!r}: body field {path!r} holds "
                     f"{'null' if value is None else type(value).__name__}, not a string, number or boolean")
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def body_of_row(rules: list[tuple[int, BodyRule]], from_body: list[tuple[int, str, str]], raw: bytes, doc: Any = None
                ) -> tuple[bytes, list[str | None]]:
    """What `reshape` makes of one row's body where body `rules` hold (xml = "keep" ones left out:
    they touch no body) and the `from_body` (rule index, header, path) of the header rules that
    hold: the body to write and each header's text (None: the field is absent). Raises BadRow
    as `reshape` does; the lane gives such a row back to the per-row lanes, which say so. `doc`:
    `raw` parsed already (a JSON object), which the rules then change in place."""
    if doc is None:
        doc = _NOTHING
    for i, rule in rules:
        if doc is _NOTHING:
            doc = _parsed(raw, f"body[{i}]")
        doc = _body(rule, doc, raw)
    values: list[str | None] = []
    for i, name, path in from_body:
        if doc is _NOTHING:
            doc = _parsed(raw, f"headers.rules[{i}].from_body")
        values.append(header_from_body(doc, path, i, name))
    return (raw if not rules else orjson.dumps(doc)), values


def _parsed(body: bytes | None, where: str) -> Any:
    try:
        return orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        raise BadRow(f"{where}: the rule applies to this message, and its body is not JSON") from None


def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return _NOTHING
        doc = doc[part]
    return doc


def _strip(doc: Any, left: int) -> int:
    """Every "$type" out of `doc`, in place; `left`: how many the body's bytes hold at most (the
    walk stops once they are all out: Newtonsoft puts most at the top)."""
    if isinstance(doc, dict):
        if doc.pop("$type", _NOTHING) is not _NOTHING:
            left -= 1
        for v in doc.values():
            if left <= 0:
                return left
            if isinstance(v, (dict, list)):
                left = _strip(v, left)
    elif isinstance(doc, list):
        for v in doc:
            if left <= 0:
                return left
            if isinstance(v, (dict, list)):
                left = _strip(v, left)
    return left


class _Plan:
    """A body rule's paths split once (most are one field at the top: no walk)."""

    __slots__ = ("deletes", "renames", "sets", "strip", "unwrap")

    def __init__(self, rule: BodyRule) -> None:
        def split(path: str) -> tuple[tuple[str, ...], str]:
            *parents, last = path.split(".")
            return tuple(parents), last

        self.unwrap, self.strip = rule.unwrap, rule.strip_types
        self.renames = [(*split(old), new) for old, new in rule.rename.items()]
        self.deletes = [split(path) for path in rule.delete]
        self.sets = [(*split(path), value) for path, value in rule.set.items()]


def _within(doc: Any, parents: tuple[str, ...], make: bool = False) -> dict[str, Any] | None:
    for part in parents:
        if not isinstance(doc, dict):
            return None
        if part not in doc and make:
            doc[part] = {}
        doc = doc.get(part)
    return doc if isinstance(doc, dict) else None


def _body(rule: BodyRule, doc: Any, raw: bytes | None) -> Any:
    plan: _Plan | None = rule.__dict__.get("_plan")
    if plan is None:
        plan = rule.__dict__.setdefault("_plan", _Plan(rule))
    if plan.unwrap is not None:
        inner = _get(doc, plan.unwrap)
        if inner is not _NOTHING:
            doc = inner
    if plan.strip and raw is not None:
        # none in the bytes, none anywhere; a "$" escaped as \u0024 hides one from the count: the whole walk then
        count = raw.count(b'"$type"') if b"\\u0024" not in raw else len(raw)
        if count:
            _strip(doc, count)
    for parents, last, new in plan.renames:
        parent = _within(doc, parents) if parents else doc if isinstance(doc, dict) else None
        if parent is not None and last in parent:
            # the renamed field keeps its place among its siblings
            if new in parent:
                items = list(parent.items())
                parent.clear()
                parent.update((new if k == last else k, v) for k, v in items)
            elif next(reversed(parent)) == last:  # the last field (often): it stays last
                parent[new] = parent.pop(last)
            else:  # the same order, with the fields after it taken out and put back
                keys = list(parent)
                value = parent.pop(last)
                after = [(k, parent.pop(k)) for k in keys[keys.index(last) + 1:]]
                parent[new] = value
                parent.update(after)
    for parents, last in plan.deletes:
        parent = _within(doc, parents) if parents else doc if isinstance(doc, dict) else None
        if parent is not None:
            parent.pop(last, None)
    for parents, last, value in plan.sets:
        parent = _within(doc, parents, make=True) if parents else doc if isinstance(doc, dict) else None
        if parent is not None:  # a table or list of the mapping's is copied: a later rule may change it in this body
            parent[last] = value if not isinstance(value, (dict, list)) else copy.deepcopy(value)
    return doc


def _transforms(mapping: Mapping, facts: MessageFacts, out: Reshaped, state: str, queue: str) -> Skipped | None:
    from bridge.mapping_rules import load

    for i, rule in enumerate(mapping.transforms):
        if not _holds(rule, facts, f"transforms[{i}]"):
            continue
        try:
            body: Any = orjson.loads(out.body or b"")
        except orjson.JSONDecodeError:
            body = out.body
        message = {"headers": dict(out.headers), "body": body, "type": out.headers.get("NServiceBus.EnclosedMessageTypes", ""),
                   "queue": queue, "state": state}
        try:
            result = load(rule.use)(message)
        except Exception as e:  # noqa: BLE001 - a plugin's failure quarantines its message, named
            raise BadRow(f"transforms[{i}] ({rule.use}) raised {type(e).__name__}: {e}") from None
        if result is None:
            return Skipped(f"transforms[{i}] ({rule.use}) skipped it")
        if not isinstance(result, dict) or not isinstance(result.get("headers"), dict):
            raise BadRow(f"transforms[{i}] ({rule.use}) returned {type(result).__name__}, not the message dict (or None)")
        out.headers = {str(k): str(v) for k, v in result["headers"].items()}
        new_body = result.get("body")
        out.body = new_body if isinstance(new_body, (bytes, type(None))) else orjson.dumps(new_body)
    return None
