"""`qbridge verify` and `qbridge status`: the books of each job, read from both databases."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from bridge.db import reading
from bridge.ledger import job_state
from bridge.ledger.totals import LEFT, OUTCOMES
from bridge.pipeline.loop import SCAN_CHUNK, JobRunner
from bridge.pipeline.stats import key_chunks
from bridge.pipeline.waiting import Waiting, beyond_checkpoint, waiting_in
from bridge.timefmt import utcnow


@dataclass
class QueueBooks:
    queue: str
    source_rows: int = 0  # rows at or below the checkpoint, and those past it in the ledger (the rest is backlog)
    delivered: int = 0
    skipped: int = 0
    quarantined: int = 0
    pending: int = 0  # committed late into an id gap; the next pass takes them
    missing: int = 0  # read past, yet in no outcome: the books do not balance
    backlog: int = 0
    source_gone: int = 0  # in the ledger, no longer in the source (legacy cleanup)
    pruned: int = 0  # entries removed once their source rows were gone and older than ledger_retention
    missing_keys: list[str] = field(default_factory=list)
    skipped_by_rule: dict[str, int] = field(default_factory=dict)
    deep: dict[str, Any] | None = None  # `verify --deep`: content compared with the source

    @property
    def balanced(self) -> bool:
        return self.missing == 0 and not (self.deep and self.deep["mismatched"])


@dataclass
class JobBooks:
    job: str
    queues: list[QueueBooks]
    unroutable_subscriptions: list[dict[str, str]]

    @property
    def balanced(self) -> bool:
        return all(q.balanced for q in self.queues)

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "balanced": self.balanced,
            "queues": [{**asdict(q), "balanced": q.balanced} for q in self.queues],
            "unroutable_subscriptions": self.unroutable_subscriptions,
        }


def verify(runner: JobRunner, deep: bool = False) -> JobBooks:
    runner.check_ledger()
    books = _books(runner)
    with reading(runner.target_engine) as tconn:
        by_rule = runner.state.skip_reasons(tconn, runner.job.name, runner.origins.values())
        counts = runner.state.counts(tconn, runner.job.name, runner.origins.values())
    for b in books.queues:
        b.skipped_by_rule = by_rule.get(b.queue, {})
        b.pruned = counts.get(b.queue, {}).get("pruned", 0)
    if deep:
        from bridge.lifecycle.verify_deep import deep_compare

        if runner.job.reverse:
            from bridge.errors import UsageError

            raise UsageError(f"job {runner.job.name!r}: --deep compares rows in NServiceBus target tables; "
                             "a reverse job's target is a legacy store (run verify without --deep)")

        compared = deep_compare(runner)
        for b in books.queues:
            b.deep = asdict(compared[b.queue])
    return books


def _books(runner: JobRunner) -> JobBooks:
    books = []
    job = runner.job.name
    with reading(runner.target_engine) as tconn, reading(runner.source_engine) as sconn:
        checkpoints = runner.state.read_checkpoints(tconn, job)
        for queue, source in runner.sources.items():
            b = QueueBooks(queue)
            if source.cursor == "scan":
                _scan_books(runner, tconn, sconn, source, b)
                books.append(b)
                continue
            if source.cursor == "queue":
                _queue_books(runner, tconn, sconn, source, b)
                books.append(b)
                continue
            cp = checkpoints.get(queue)
            if cp is not None and cp.high is not None:
                _monotonic_books(runner, tconn, sconn, source, cp, b)
            # Past the checkpoint: the backlog, and what an interrupted migration recorded there
            past = beyond_checkpoint(runner, tconn, sconn, source, cp.high if cp else None)
            b.backlog = past.waiting
            b.source_gone += past.gone
            b.source_rows += past.recorded.total()
            for outcome, n in past.recorded.items():
                setattr(b, outcome, getattr(b, outcome) + n)
            books.append(b)
        subs = {s for source in runner.sources.values() for s in source.subscriptions(sconn)}
        unroutable = [
            {"endpoint": s.endpoint, "topic": s.topic, "reason": "no route for the subscriber queue"}
            for s in sorted(subs, key=lambda s: (s.endpoint, s.topic)) if s.endpoint not in runner.mapping.routes
        ]
        for source in runner.sources.values():
            unroutable += getattr(source, "unexpressible", lambda conn: [])(sconn)
    return JobBooks(job, books, unroutable)




def _monotonic_books(runner: JobRunner, tconn: sa.Connection, sconn: sa.Connection, source: Any, cp: Any,
                     b: QueueBooks) -> None:
    """Source keys up to the checkpoint merged with the queue's ranges and the job's ledger
    entries, all streamed in key order (bounded memory at any size)."""
    ledger = runner.state.recorded_keys(tconn, runner.job.name, runner.origins[source.queue])
    entry = next(ledger, None)
    unexplained: list[str] = []
    for key in source.keys_upto(sconn, cp.high):
        b.source_rows += 1
        while entry is not None and entry[0] < key:
            b.source_gone += 1  # in the ledger, no longer in the source (legacy cleanup)
            entry = next(ledger, None)
        if entry is not None and entry[0] == key:
            setattr(b, entry[1], getattr(b, entry[1]) + 1)
            entry = next(ledger, None)
        elif any(g.lo <= key <= g.hi for g in cp.gaps):
            b.pending += 1
        else:
            unexplained.append(str(key))
            if len(unexplained) >= SCAN_CHUNK:
                _explain(runner, tconn, source, unexplained, b)
                unexplained = []
    # What lies past the checkpoint is not gone: beyond_checkpoint counts it (an interrupted migration's)
    b.source_gone += sum(1 for k, _ in ledger if k <= cp.high) + (entry is not None and entry[0] <= cp.high)
    _explain(runner, tconn, source, unexplained, b)


def _explain(runner: JobRunner, tconn: sa.Connection, source: Any, keys: list[str], b: QueueBooks) -> None:
    """Keys not in this job's ledger: another job reading the same queue may have them; else missing."""
    elsewhere = runner.ledger_lookup(tconn, source, keys)
    for k in keys:
        outcome = elsewhere.get(k)
        if outcome:
            setattr(b, outcome, getattr(b, outcome) + 1)
        else:
            b.missing += 1
            if len(b.missing_keys) < 20:
                b.missing_keys.append(k)


def _scan_books(runner: JobRunner, tconn: sa.Connection, sconn: sa.Connection, source: Any, b: QueueBooks) -> None:
    """A scan source has no checkpoint: each row there now is in an outcome or in the backlog."""
    for keys in key_chunks(source.iter_keys(sconn)):
        outcomes = runner.ledger_lookup(tconn, source, keys)
        b.backlog += len(keys) - len(outcomes)
        b.source_rows += len(outcomes)
        for outcome in outcomes.values():
            setattr(b, outcome, getattr(b, outcome) + 1)


def _queue_books(runner: JobRunner, tconn: sa.Connection, sconn: sa.Connection, source: Any, b: QueueBooks) -> None:
    """A consumed queue (NServiceBus proxy queues): what left it is in the ledger; what is still
    there is backlog, or `pending` when the ledger has it (its delete did not commit yet)."""
    counts = runner.state.counts(tconn, runner.job.name, [runner.origins[source.queue]]).get(source.queue, {})
    for outcome in OUTCOMES:  # now (what left an outcome is counted apart: bridge.ledger.totals)
        setattr(b, outcome, counts.get(outcome, 0))
    b.source_rows = b.delivered + b.skipped + b.quarantined
    for keys in key_chunks(source.queued_keys(sconn)):
        known = runner.ledger_lookup(tconn, source, keys)
        b.pending += len(known)
        b.backlog += len(keys) - len(known)


def status(runner: JobRunner) -> dict[str, Any]:
    """Per job: last run, rows moved, lag, backlog, quarantine count (and per queue)."""
    job = runner.job.name
    runner.check_ledger()
    with reading(runner.target_engine) as tconn:
        checkpoints = runner.state.read_checkpoints(tconn, job)
        counts = runner.state.counts(tconn, job, runner.origins.values())
        table = runner.state.job_state  # made by init, or by the first `run` on older books
        run = job_state.read(tconn, table, [job])[job] if runner.kept(table, tconn) else job_state.RunState()
    queues: list[dict[str, Any]] = []
    backlog_error = None
    try:
        with reading(runner.source_engine) as sconn, reading(runner.target_engine) as tconn:
            waiting = {q: waiting_in(runner, tconn, sconn, s, checkpoints.get(q)) for q, s in runner.sources.items()}
    except sa.exc.SQLAlchemyError as e:
        waiting = {}
        backlog_error = str(getattr(e, "orig", e)).splitlines()[0]
    now = utcnow()
    for queue in runner.sources:
        cp = checkpoints.get(queue)
        c = counts.get(queue, {})
        queues.append({
            "queue": queue,
            "last_run": cp.last_run_at.isoformat() if cp and cp.last_run_at else None,
            "delivered": c.get("delivered", 0),
            "skipped": c.get("skipped", 0),
            "quarantined": c.get("quarantined", 0),
            # What ever happened, which only grows (Prometheus's counters): now, plus what left since.
            "ever": {outcome: c.get(outcome, 0) + c.get(LEFT.get(outcome, ""), 0) for outcome in OUTCOMES},
            "backlog": waiting[queue].rows if queue in waiting else None,
            # the age of the oldest message still waiting, however the job stands (paused, held, failing)
            "lag_seconds": waiting.get(queue, Waiting(1, None)).lag_seconds(now),
            "open_gaps": len(cp.gaps) if cp else 0,
            "seconds_since_last_delivery": (now - cp.last_delivery_at).total_seconds() if cp and cp.last_delivery_at else None,
        })
    steering = runner.steering().as_json()
    state, why = job_state.overall(run, steering)
    runs = [q["last_run"] for q in queues if q["last_run"]]
    lags = [q["lag_seconds"] for q in queues if q["lag_seconds"] is not None]
    backlog_values = [q["backlog"] for q in queues if q["backlog"] is not None]
    return {
        "job": job,
        "mode": runner.job.mode,
        "last_run": max(runs) if runs else None,
        "rows_moved": sum(q["delivered"] for q in queues),
        "lag_seconds": max(lags) if lags else None,
        "backlog": sum(backlog_values) if backlog_values and backlog_error is None else None,
        "quarantined": sum(q["quarantined"] for q in queues),
        "source_error": backlog_error,
        "steering": steering,
        "max_rate": runner.configured.max_rate,  # as the config gives it ("50/s"); None: no limit
        # running | paused | held | failing | stopped, and why (bridge.ledger.job_state)
        "state": state,
        "state_reason": why,
        "queues": queues,
    }
