"""NGinn rows for the columnar lane (bridge.sources.columns): the checks `NGinnSource.plain` makes
per row, made per batch on Arrow columns, and one example message per group of rows.

A row is taken only when it is provably the common case. Every other row is left for `plain`
and `decode`, which say what is wrong with it. The row is left out when it:
- is in a state NGinn does not define;
- has a NULL time, a retry count that is not a non-negative integer, or a body that is not a JSON
  object (or whose `$type` is not a string);
- has a header pair that does not split into two on `=`, or a control character, or a whitespace
  character other than the space, in its headers;
- has a control character in a column that a header copies (a stack trace may hold line breaks
  and tabs), or, failed, an error text that does not name an exception type, or names one with
  a message longer than NServiceBus keeps;
- has a local time the zone's clock change makes ambiguous or skips, or one outside the years
  1000 to 2037 (Arrow's zone rules stop at 2037; zoneinfo's go on);
- has a control character in its body's `$type` or its `to_endpoint`, which the group's example
  carries as they are.
A group is left out when its header names repeat or name a TTL. So is the whole batch when a
column's values are not the types NGinn's schema gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from bridge.codecs import nginn as codec
from bridge.codecs.compiled import compiled
from bridge.model import MESSAGE_MAX, FailureInfo, PlainMessage
from bridge.sources.arrow_fetched import ArrowFetched
from bridge.sources.base import SourceRow
from bridge.sources.columns import DUE, FAILED, SENT, PlainColumns, mark, taken
from bridge.sources.columns import np_bool as _np
from bridge.sources.columns import wire as _wire
from bridge.sources.fetched import keys_of, values_at

LANE_STATES = {"I": "ready", "R": "delayed", "X": "processed", "F": "failed"}
# What str.strip() strips besides the space (every character whose isspace() is true; a test
# holds the list to Python's), with the other control characters: where they are, the row is
# left out, so that trimming spaces is all the lane's strip must do.
WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200b))) + "\u2028\u2029\u202f\u205f\u3000"
_ODD = "[\\x00-\\x1f\\x7f-\\x9f" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE if ord(c) > 0x9f) + "]"
_CONTROL = r"[\x00-\x1f]"
_CONTROL_BUT_LINES = r"[\x00-\x08\x0b\x0c\x0e-\x1f]"  # a stack trace's \t, \n and \r are escaped
_SEP = "\x1e"  # between the parts of a group key (a control character, so in no lane value)
# bodytype_native.root_types when it was built: a body's root `$type` where it is sure, DEFER where orjson decides.
ROOT_TYPES: Callable[[list[Any], list[bool]], tuple[list[Any], list[int]]] | None = compiled("bodytype_native", "root_types")


def plain_columns(rows: Sequence[SourceRow], take: Sequence[int], mids: Sequence[str], tz: str, queue: str,
                  build: Callable[..., PlainMessage], keep_bodies: bool = False) -> PlainColumns | None:
    """The rows at `take` (with their message ids `mids`) that the lane can prove to be the
    common case, or None when there are none, or the batch does not convert. `tz` is the legacy
    server's zone, `queue` the source queue; `build` is NGinnSource.plain_of, which makes each
    group's example; `keep_bodies`: the columns keep each body as parsed (PlainColumns.docs)."""
    def column(name: str, kind: pa.DataType) -> pa.Array:
        # A read-ahead's columns are Arrow already (bridge.sources.arrow_fetched).
        a = rows.array(name, take) if isinstance(rows, ArrowFetched) else pa.array(values_at(rows, take, name))
        if isinstance(a, pa.ChunkedArray):  # over 2 GiB of text in one batch: the per-row lanes take it
            raise TypeError(f"{name}: {a.num_chunks} chunks")
        if a.type == pa.null():
            return a.cast(kind)
        if a.type != kind:
            raise TypeError(f"{name}: {a.type}")
        return a

    try:
        subqueue = column("subqueue", pa.string())
        inserted = column("insert_time", pa.timestamp("us"))
        retried = column("retry_time", pa.timestamp("us"))
        processed = column("last_processed", pa.timestamp("us"))
        errors = column("error_info", pa.string())
        text = column("msg_text", pa.string())
        headers = column("msg_headers", pa.string())
        texts = {name: column(name, pa.string()) for name in
                 ("from_endpoint", "to_endpoint", "correlation_id", "label", "unique_id")}
    except (TypeError, pa.ArrowException):
        return None  # a driver gave other types: the per-row lane looks at each value
    counts = values_at(rows, take, "retry_count")
    ok = np.array([type(c) is int and c >= 0 for c in counts], dtype=bool)
    ok &= _np(pc.is_in(subqueue, value_set=pa.array(list(LANE_STATES))))
    ok &= _np(pc.and_(pc.and_(pc.is_valid(inserted), pc.is_valid(retried)), pc.is_valid(text)))
    headers = pc.fill_null(headers, "")
    ok &= ~_np(pc.match_substring_regex(headers, _ODD))
    # A control character in any of the five: one search of them end to end (per call, not per
    # value, is what a batch's checks cost at the default batch size).
    ok &= ~_np(pc.match_substring_regex(pc.binary_join_element_wise(*texts.values(), "", null_handling="replace"), _CONTROL))
    # The three times as one array: the zone's rules are looked up per call, not per value.
    n = len(take)
    local = pa.concat_arrays([inserted, retried, pc.coalesce(processed, retried)])
    utc, sure = _utc(local, tz)
    sure &= _years_ok(local)
    sent, due, failed_at = utc.slice(0, n), utc.slice(n, n), utc.slice(2 * n, n)
    delayed = _np(pc.equal(subqueue, "R"))
    failed = _np(pc.equal(subqueue, "F"))
    ok &= sure[:n] & (sure[n:2 * n] | ~delayed) & (sure[2 * n:] | ~failed)
    ok &= ~(failed & _np(pc.match_substring_regex(pc.fill_null(errors, ""), _CONTROL_BUT_LINES)))
    parsed: dict[int, Any] = {}
    for i in np.flatnonzero(ok & failed).tolist():
        e = codec.parse_exception(errors[i].as_py())
        if not e.exception_type or len(e.message) > MESSAGE_MAX:  # its parts hold no other control character
            ok[i] = False
        parsed[i] = e
    # The driver's own texts (the column's values), not the Arrow array's made again. Parsed
    # bodies are kept only for rules that change or read them: a batch of them held to the write
    # costs the plain path its time (the collector walks them) and memory.
    types, docs = _body_types(values_at(rows, take, "msg_text"), ok.tolist(), keep_bodies)
    body_types = pa.array(types, pa.string())
    ok &= _np(pc.is_valid(body_types)) & ~_np(pc.match_substring_regex(body_types, _CONTROL))
    names, values, split_ok = _split(headers, len(take))
    ok &= split_ok
    if not ok.any():
        return None
    keep = np.flatnonzero(ok)

    def kept(a: pa.Array) -> pa.Array:
        return taken(a, keep)

    names, values = kept(names), kept(values)
    reply = _header(names, values, codec.HDR_REPLY_TO)
    msg_type = _header(names, values, codec.HDR_MSG_TYPE)
    body_type = kept(body_types)
    from_body = pc.not_equal(body_type, "")
    legacy_type = pc.if_else(from_body, body_type, pc.fill_null(msg_type, ""))
    subqueue, texts = kept(subqueue), {k: pc.fill_null(kept(a), "") for k, a in texts.items()}
    retry_count = pa.array([counts[i] for i in keep.tolist()], pa.int64())
    failures = _failure_columns(parsed, keep)
    inner = pc.not_equal(failures["inner"], "")
    flags = {"uid": pc.not_equal(texts["unique_id"], ""), "label": pc.not_equal(texts["label"], ""),
             "retry": pc.not_equal(retry_count, 0), "corr": pc.not_equal(texts["correlation_id"], ""),
             "from_body": from_body, "inner": inner}
    key = pc.binary_join_element_wise(
        pc.list_value_length(names).cast(pa.string()), pc.binary_join(names, "\x1f"), *(pc.if_else(f, "1", "0") for f in flags.values()), legacy_type,
        texts["to_endpoint"], pc.fill_null(reply, ""), pc.is_valid(reply).cast(pa.string()), subqueue, _SEP)
    encoded = pc.dictionary_encode(key)
    groups = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    _, first = np.unique(groups, return_index=True)
    keys = keys_of(rows)
    row_keys = [str(keys[take[i]]) for i in keep.tolist()]
    lane_mids = [mids[i] for i in keep.tolist()]
    examples = []
    for g, at in enumerate(first.tolist()):
        example = _example(build, queue, rows[take[int(keep[at])]].values, names[at].as_py(), flags, at,
                           legacy_type[at].as_py(), reply[at].as_py(), subqueue[at].as_py())
        if example is None:  # a TTL or a repeated name: every row of the group goes the per-row way
            groups[groups == g] = -1
        examples.append(example)
    lane = groups >= 0
    if not lane.any():
        return None
    sent_utc, due_utc = kept(sent), kept(due)
    k = len(keep)
    # One pass of the wire text, not three. A due time is only a delayed row's and a failure
    # time only a failed row's: the others' were never checked (a .NET DateTime.MinValue for
    # "never" lies before year 1 in UTC) and are not rendered.
    is_due, is_failed, never = pc.equal(subqueue, "R"), pc.equal(subqueue, "F"), pa.scalar(None, due_utc.type)
    wired = _wire(pa.concat_arrays([sent_utc, pc.if_else(is_due, due_utc, never), pc.if_else(is_failed, kept(failed_at), never)]))
    cols = {
        "mid": pa.array(lane_mids, pa.string()), "key": pa.array(row_keys, pa.string()),
        "from": texts["from_endpoint"], "uid": texts["unique_id"], "label": texts["label"],
        "corr": texts["correlation_id"], "retry": retry_count.cast(pa.string()),
        "sent": wired.slice(0, k),
        "due": wired.slice(k, k),
        "failed_at": wired.slice(2 * k, k),
        **failures,
        "stack": pc.fill_null(kept(errors), ""),
    }
    pick = np.flatnonzero(lane)
    values = taken(values, pick)
    return PlainColumns(
        positions=np.asarray(take, dtype=np.int64)[keep[lane]],
        groups=groups[lane],
        examples=examples,
        values={k: taken(a, pick) for k, a in cols.items()},
        header_values=pc.list_flatten(values),
        header_starts=_starts(values),
        bodies=taken(kept(text), pick).cast(pa.binary()),
        sent=taken(sent_utc, pick),
        due=taken(pc.if_else(is_due, due_utc, pa.scalar(None, due_utc.type)), pick),
        mids=[lane_mids[i] for i in np.flatnonzero(lane).tolist()],
        keys=[row_keys[i] for i in np.flatnonzero(lane).tolist()],
        docs=None if docs is None else [docs[i] for i in keep[lane].tolist()],
    )


def _failure_columns(parsed: dict[int, Any], keep: np.ndarray) -> dict[str, pa.Array]:
    """The exception type, message and inner type of each kept row ("" where it is no failure),
    from the failed rows' parsed error texts (`parsed`, by batch place)."""
    blank = pa.repeat("", len(keep))
    if not parsed:
        return {"etype": blank, "emsg": blank, "inner": blank}
    at = np.isin(keep, np.fromiter(parsed, dtype=np.int64, count=len(parsed)))
    found = [parsed[i] for i in keep[at].tolist()]
    mask = pa.array(at)
    return {name: pc.replace_with_mask(blank, mask, pa.array([get(f) for f in found], pa.string()))
            for name, get in (("etype", lambda f: f.exception_type), ("emsg", lambda f: f.message),
                              ("inner", lambda f: f.inner_exception_type or ""))}


def _utc(local: pa.Array, tz: str) -> tuple[pa.Array, np.ndarray]:
    """Local times in zone `tz` as UTC, and which of them are sure: a time a clock change makes
    ambiguous, or skips, reads two ways, and is left to the per-row clock."""
    early = pc.assume_timezone(local, timezone=tz, ambiguous="earliest", nonexistent="earliest")
    late = pc.assume_timezone(local, timezone=tz, ambiguous="latest", nonexistent="latest")
    return early.cast(pa.timestamp("us", "UTC")), _np(pc.equal(early, late))


def _years_ok(local: pa.Array) -> np.ndarray:
    """Times in the years whose zone rules Arrow and zoneinfo read alike, and whose wire text
    has four digits of year (1000 to 2037)."""
    year = pc.year(local)
    return _np(pc.and_(pc.greater_equal(year, 1000), pc.less_equal(year, 2037)))


def _body_types(texts: Sequence[Any], ok: list[bool], keep: bool) -> tuple[list[str | None], list[Any] | None]:
    """Each body's root `$type` ("" for none), or None where the row is not `ok` or its body is not
    a JSON object with a string `$type` or none (codec.body_type's rules, stricter: not an object
    is left out too); with `keep`, the bodies parsed (None where not an object), for the body
    rules (bridge.targets.lane_rules). Without `keep`, the compiled scanner answers the bodies it
    is sure of without making their objects, and orjson the others (bridge/codecs/bodytype_native.pyx)."""
    if keep or ROOT_TYPES is None:
        return _parsed_types(texts, ok, keep)
    types, deferred = ROOT_TYPES(texts if isinstance(texts, list) else list(texts), ok)
    if deferred:
        again, _ = _parsed_types([texts[i] for i in deferred], [True] * len(deferred), False)
        for i, t in zip(deferred, again):
            types[i] = t
    return types, None


def _parsed_types(texts: Sequence[Any], ok: list[bool], keep: bool) -> tuple[list[str | None], list[Any] | None]:
    """_body_types by orjson, each body parsed. One loop with its names local: a call a row costs."""
    loads, invalid = orjson.loads, orjson.JSONDecodeError
    types: list[str | None] = []
    docs: list[Any] | None = [] if keep else None
    for text, good in zip(texts, ok):
        doc = None
        if good:
            try:
                doc = loads(text)
            except invalid:
                pass
            if type(doc) is not dict:
                doc = None
        if docs is not None:
            docs.append(doc)
        if doc is None:
            types.append(None)
            continue
        value = doc.get("$type")
        types.append("" if value is None else value if type(value) is str else None)
    return types, docs


def _split(headers: pa.Array, n: int) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """codec.parse_headers on a column: (the names, the values, both lists per row in order; which
    rows split cleanly: every non-empty pair into exactly two)."""
    pairs = pc.split_pattern(headers, "|")
    flat = pc.list_flatten(pairs)
    parent = np.asarray(pc.list_parent_indices(pairs).to_numpy(zero_copy_only=False), dtype=np.int64)
    filled = _np(pc.not_equal(flat, ""))
    flat, parent = flat.filter(pa.array(filled)), parent[filled]
    parts = pc.split_pattern(flat, "=")
    two = np.asarray(pc.list_value_length(parts).to_numpy(zero_copy_only=False)) == 2
    ok = np.ones(n, dtype=bool)
    ok[parent[~two]] = False
    kept = ok[parent]
    parts, parent = parts.filter(pa.array(kept)), parent[kept]
    names = pc.utf8_trim(pc.list_element(parts, 0), " ")
    values = pc.utf8_trim(pc.list_element(parts, 1), " ")
    offsets = pa.array(np.concatenate([[0], np.cumsum(np.bincount(parent, minlength=n))]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, names), pa.ListArray.from_arrays(offsets, values), ok


def _starts(lists: pa.ListArray) -> np.ndarray:
    """Where each list begins in pc.list_flatten(lists)."""
    offsets = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets[:-1] - offsets[0]


def _header(names: pa.Array, values: pa.Array, name: str) -> pa.Array:
    """Each row's value of header `name` (null where it has none; a repeated name's group is left out)."""
    flat_names = pc.list_flatten(names)
    parent = np.asarray(pc.list_parent_indices(names).to_numpy(zero_copy_only=False), dtype=np.int64)
    where = np.flatnonzero(_np(pc.equal(flat_names, name)))
    index = np.full(len(names), -1, dtype=np.int64)
    index[parent[where]] = where
    return pc.list_flatten(values).take(pa.array(index, mask=index < 0))


def _example(build: Callable[..., PlainMessage], queue: str, real: dict[str, Any], names: list[str],
             flags: dict[str, pa.Array], at: int, legacy_type: str, reply: str | None, letter: str) -> Any:
    """The group's PlainMessage: real values where the code looks at them, markers where it passes
    them through; None when the group needs the per-row lane (a TTL header, a repeated name)."""
    if len(set(names)) != len(names) or codec.HDR_TTL in names:
        return None
    on = {k: bool(f[at].as_py()) for k, f in flags.items()}
    v = dict(real)
    v["from_endpoint"] = mark("from")  # `or ""`: the marker's column holds "" for an empty one
    v["unique_id"] = mark("uid") if on["uid"] else ""
    v["label"] = mark("label") if on["label"] else ""
    v["retry_count"] = mark("retry") if on["retry"] else 0
    v["correlation_id"] = mark("corr") if on["corr"] else None
    headers = {name: mark(f"L{k}") for k, name in enumerate(names)}
    if reply is not None:
        headers[codec.HDR_REPLY_TO] = reply
    if codec.HDR_MSG_TYPE in headers and not on["from_body"]:
        headers[codec.HDR_MSG_TYPE] = legacy_type  # it made the legacy type: real, one per group
    state = LANE_STATES[letter]
    failure = None
    if state == "failed":  # NGinnSource._failure's fields, each the row's own
        failure = FailureInfo(mark("etype"), mark("emsg"), mark("stack"), queue, FAILED,
                              mark("inner") if on["inner"] else None)
    return build(state, mark("mid"), mark("key"), v, headers, legacy_type or None, SENT,
                 DUE if state == "delayed" else None, b"", failure)
