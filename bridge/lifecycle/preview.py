"""`qbridge preview`: what `migrate` would do, read and mapped exactly as it would, writing
nothing anywhere (issue 28).

Every pending row of every queue of a job is read in batches, looked up in the ledger, decoded
and mapped by the job's own runner (the fast lane first, the validated path for the rest, as a
batch does), and counted: by legacy state, by target table, by skip rule, by quarantine reason
(with a few example keys), already delivered, types the mapping has no `[types]` entry for. It
opens its own connections, read-only on PostgreSQL, and never creates a checkpoint, so a role
with SELECT rights alone on both sides can run it. A queue of increasing keys with
PARALLEL_ROWS or more is read in key slices by worker processes, one per usable core, as
`migrate` spreads the same mapping over Spark's tasks; their counts add up to what one process
makes of the queue. Memory is bounded by a batch per process and by the caps on distinct
reasons and types kept.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import sqlalchemy as sa

from bridge.config import Config
from bridge.db import read_only_engine
from bridge.errors import SourceSchemaError
from bridge.ledger.upgrade import require_current
from bridge.mapping_rules import MATCHED
from bridge.pipeline.cpus import usable_cpus
from bridge.pipeline.loop import JobRunner
from bridge.sources import Source, SourceRow
from bridge.targets.base import Skipped

REASONS = 100  # distinct quarantine reasons kept per queue; the rest are counted together
EXAMPLES = 3  # example keys per reason
TYPES = 1000  # distinct unmapped types kept per queue
QUEUE_HEAD = 10_000  # rows of a reverse job's proxy queue previewed (its head: consumed rows leave it)
OTHER = "(other reasons)"
PARALLEL_ROWS = 100_000  # rows of a queue from which preview reads it in slices, a process each
MAX_WORKERS = 8


@dataclass
class QueuePreview:
    queue: str
    rows: int = 0
    states: Counter[str] = field(default_factory=Counter)  # legacy state; "unreadable" when it cannot be decoded
    tables: Counter[str] = field(default_factory=Counter)  # target table -> rows it would get
    skipped: Counter[str] = field(default_factory=Counter)  # mapping rule -> rows
    already: int = 0  # in the ledger: delivered, skipped or quarantined before
    quarantined: dict[str, dict[str, Any]] = field(default_factory=dict)  # reason -> {"count", "examples"}
    untyped: Counter[str] = field(default_factory=Counter)  # legacy types with no [types] entry
    rules: Counter[str] = field(default_factory=Counter)  # a rule of the mapping ("skip[0] 'test'") -> rows it applied to
    rule_examples: dict[str, str] = field(default_factory=dict)  # a rule -> the source key of a row it applied to
    head_only: bool = False  # a reverse job's proxy queue: its first QUEUE_HEAD rows
    problem: str | None = None  # why it could not be read (a table missing), said instead of counts

    @property
    def quarantine_count(self) -> int:
        return sum(q["count"] for q in self.quarantined.values())

    def quarantine(self, reason: str, key: str) -> None:
        if reason not in self.quarantined and len(self.quarantined) >= REASONS:
            reason = OTHER
        q = self.quarantined.setdefault(reason, {"count": 0, "examples": []})
        q["count"] += 1
        if len(q["examples"]) < EXAMPLES:
            q["examples"].append(key)

    def add(self, part: QueuePreview) -> None:
        """Counts `part`, a slice of the same queue read after the rows counted so far, as if its
        rows had been counted here one by one (the same caps on reasons, examples and types)."""
        self.rows += part.rows
        self.already += part.already
        self.states.update(part.states)
        self.tables.update(part.tables)
        self.skipped.update(part.skipped)
        for reason, r in part.quarantined.items():
            if reason not in self.quarantined and len(self.quarantined) >= REASONS:
                reason = OTHER
            q = self.quarantined.setdefault(reason, {"count": 0, "examples": []})
            q["count"] += r["count"]
            q["examples"] = (q["examples"] + r["examples"])[:EXAMPLES]
        for name, n in part.untyped.items():
            if name in self.untyped or len(self.untyped) < TYPES:
                self.untyped[name] += n
        self.rules.update(part.rules)
        for rule, key in part.rule_examples.items():
            self.rule_examples.setdefault(rule, key)


@dataclass
class JobPreview:
    job: str
    queues: list[QueuePreview] = field(default_factory=list)
    subscriptions: list[dict[str, str]] = field(default_factory=list)  # would be migrated
    unroutable: list[dict[str, str]] = field(default_factory=list)  # cannot be, with the reason
    missing_tables: list[str] = field(default_factory=list)  # what `init` would create
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(q.rows for q in self.queues)

    @property
    def to_write(self) -> int:
        return sum(sum(q.tables.values()) for q in self.queues)

    def to_json(self) -> dict[str, Any]:
        rate = self.rows / self.seconds if self.seconds else None
        # asdict would rebuild each Counter from its items (counting the pairs): dict() them first.
        queues = [{f.name: (dict(v) if isinstance(v := getattr(q, f.name), Counter) else v) for f in fields(q)}
                  for q in self.queues]
        return {**asdict(self), "queues": queues, "rows": self.rows, "rate": rate,
                "estimated_migrate_seconds": (self.rows / rate) if rate else 0.0,
                "quarantined": sum(q.quarantine_count for q in self.queues)}


def preview(runner: JobRunner, missing_tables: list[str], config: Config | None = None) -> JobPreview:
    """Reads and maps every pending row of the job's queues; writes nothing. With the `config`
    the runner was made from, a large queue of increasing keys is read in slices by processes
    of their own, one per usable core (`_slices`)."""
    out = JobPreview(runner.job.name, missing_tables=missing_tables)
    started = time.monotonic()
    source_engine = read_only_engine(runner.source_url, missing_ok=runner.job.reverse)  # proxy queues: made by init
    target_engine = read_only_engine(runner.target_url, missing_ok=True)
    try:
        with source_engine.connect() as sconn, source_engine.connect() as kconn, target_engine.connect() as tconn:
            l = runner.state.ledger
            ledger = sa.inspect(tconn).has_table(l.name, schema=l.schema)  # before `init`, nothing is delivered yet
            if ledger:
                require_current(tconn, runner.state.ledger.schema, runner.job.target.connection)
            for queue, source in runner.sources.items():
                q = QueuePreview(queue, head_only=source.cursor == "queue")
                out.queues.append(q)
                try:
                    source.check_schema(sconn)
                except SourceSchemaError as e:
                    q.problem = str(e)  # a reverse job's proxy queue before `init`, or a legacy table missing
                    continue
                slices = _slices(source, sconn) if config is not None else []
                if len(slices) > 1:
                    assert config is not None
                    for part in _in_processes(config, runner.job.name, queue, ledger, slices):
                        q.add(part)
                    continue
                for rows in _batches(runner, source, sconn, kconn):
                    _count(runner, source, tconn if ledger else None, rows, q)
            if not runner.job.reverse:
                _subscriptions(runner, sconn, out)
    finally:
        source_engine.dispose()
        target_engine.dispose()
    out.seconds = time.monotonic() - started
    return out


def _slices(source: Source, sconn: sa.Connection) -> list[tuple[int | None, int | None]]:
    """(after, upto] key ranges of about equal width, one per usable core, for a queue of
    increasing keys holding PARALLEL_ROWS or more (below that, starting a process costs more
    than it saves); [] otherwise. `migrate` spreads the same mapping over Spark's tasks, so
    preview, the same reading and mapping without the writes, does it on as many cores."""
    workers = min(usable_cpus(), MAX_WORKERS)
    if source.cursor != "monotonic" or workers < 2 or source.count_after(sconn, None) < PARALLEL_ROWS:
        return []
    first, last = source.fetch_after(sconn, None, 1, False), source.max_key(sconn)
    if not first or last is None:
        return []
    low = int(first[0].key) - 1
    step = max(1, (int(last) - low) // workers)
    cuts = [low + step * i for i in range(1, workers)]
    return list(zip([None, *cuts], [*cuts, None]))  # the last one open: rows that came since


def _in_processes(config: Config, job: str, queue: str, ledger: bool,
                  slices: list[tuple[int | None, int | None]]) -> list[QueuePreview]:
    """The slices' previews, each made in a process of its own, in key order."""
    with ProcessPoolExecutor(max_workers=len(slices), mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = [pool.submit(_preview_slice, config, job, queue, ledger, after, upto) for after, upto in slices]
        return [part.result() for part in parts]


def _preview_slice(config: Config, job: str, queue: str, ledger: bool, after: int | None, upto: int | None) -> QueuePreview:
    """One slice of a queue previewed, in a worker process (read-only connections of its own)."""
    from bridge.pipeline import gc_policy

    gc_policy.for_batches()
    [job_config] = config.select(job)
    runner = JobRunner(config, job_config)
    source = runner.sources[queue]
    q = QueuePreview(queue)
    source_engine = read_only_engine(runner.source_url, missing_ok=runner.job.reverse)  # proxy queues: made by init
    target_engine = read_only_engine(runner.target_url, missing_ok=True)
    try:
        with source_engine.connect() as sconn, target_engine.connect() as tconn:
            for rows in _batches(runner, source, sconn, sconn, after, upto):
                _count(runner, source, tconn if ledger else None, rows, q)
    finally:
        source_engine.dispose()
        target_engine.dispose()
    return q


def _batches(runner: JobRunner, source: Source, sconn: sa.Connection, kconn: sa.Connection,
             after: int | None = None, upto: int | None = None) -> Iterator[Sequence[SourceRow]]:
    """`after`/`upto`: the key range of a slice (increasing keys only)."""
    size = runner.job.batch_size
    if source.cursor == "monotonic":
        cursor = after
        while True:
            rows = source.fetch_after(sconn, cursor, size, False, upto=upto)
            if rows:
                yield rows
            if len(rows) < size:
                return
            cursor = rows[-1].key
    elif source.cursor == "scan":
        keys = source.iter_keys(kconn)
        for chunk in iter(lambda: list(itertools.islice(keys, size)), []):
            yield source.fetch_keys(sconn, chunk, False)
    else:
        yield source.fetch_after(sconn, None, QUEUE_HEAD, False)


def _count(runner: JobRunner, source: Source, tconn: sa.Connection | None, rows: Sequence[SourceRow], q: QueuePreview) -> None:
    keys = [source.ledger_key(r) for r in rows]
    known = runner.state.known(tconn, runner.origins[source.queue], keys, ranged=source.cursor == "monotonic") if tconn else {}
    translated: frozenset[str] = getattr(source, "translated_headers", frozenset())
    types = runner.mapping.types
    for row, key in zip(rows, keys):
        q.rows += 1
        if key in known:
            q.already += 1
            continue
        seen: list[str] = []
        token = MATCHED.set(seen)
        try:
            state, enclosed, result, reason = _map(runner, source, row, translated)
        finally:
            MATCHED.reset(token)
        q.states[state] += 1
        for t in enclosed:
            by_rule = runner.mapping.type_rule_of(t) if runner.mapping.type_rules else None
            if by_rule is not None:
                if result is not None and not isinstance(result, Skipped):  # types are mapped for what is delivered
                    seen.append(f"types.rules[{by_rule}]")
            elif t not in types and (t in q.untyped or len(q.untyped) < TYPES):
                q.untyped[t] += 1
        for rule in dict.fromkeys(seen):
            q.rules[rule] += 1
            q.rule_examples.setdefault(rule, key)
        if result is None:
            q.quarantine(reason, key)
        elif isinstance(result, Skipped):
            q.skipped[result.reason] += 1
        else:
            q.tables[runner.target.ledger_target(result)] += 1


def _map(runner: JobRunner, source: Source, row: SourceRow, translated: frozenset[str]) -> tuple[str, list[str], Any, str]:
    """(legacy state, its legacy types, what the target makes of it or None, why not): the fast
    lane when source and target have one, else the validated path, as a batch maps a row."""
    fast = runner.fast_map(source, row, str(runner.message_id(source, row)), translated) if runner.lane_for(source) else None
    if fast is not None:
        out, plain = fast
        return plain.state, plain.enclosed_types, out, ""
    msg, result, reason = runner.map_row(source, row, translated)
    return (msg.state, list(msg.enclosed_types), result, "") if msg is not None else ("unreadable", [], None, reason)


def _subscriptions(runner: JobRunner, sconn: sa.Connection, out: JobPreview) -> None:
    subs = sorted({s for source in runner.sources.values() for s in source.subscriptions(sconn)},
                  key=lambda s: (s.endpoint, s.topic))
    for s in subs:
        row = {"endpoint": s.endpoint, "topic": s.topic}
        if s.endpoint in runner.mapping.routes:
            out.subscriptions.append({**row, "to": runner.mapping.routes[s.endpoint], "as": runner.mapping.map_topic(s.topic)})
        else:
            out.unroutable.append({**row, "reason": "no route for the subscriber queue"})
    for source in runner.sources.values():
        out.unroutable += getattr(source, "unexpressible", lambda conn: [])(sconn)
