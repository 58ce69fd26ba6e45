"""What still waits in a source: how many rows (the backlog) and when the oldest of them was sent
(the lag's start), read as cheaply as each kind of source allows (issue 46.3).

- cursor "id" (NGinn): a count after the checkpoint, and the first row after it (an index seek);
- cursor "queue" (NServiceBus proxy queues): the tables' counts, and the head row's TimeSent;
- cursor "scan" (OpenJMS, BizTalk): one walk of every key against the ledger, as the count
  needs anyway, which reads each key's time beside it (acceptedTime, Spool.dtTimeStamp)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from bridge.pipeline.loop import JobRunner
from bridge.pipeline.stats import chunked
from bridge.timefmt import utcnow


class Waiting(NamedTuple):
    rows: int
    oldest: datetime | None  # when the oldest waiting message was sent (UTC); None: none waits, or the source cannot say

    def lag_seconds(self, now: datetime | None = None) -> float | None:
        """The age of the oldest message still waiting: 0 with none, None when it cannot be told."""
        if self.rows == 0:
            return 0.0
        if self.oldest is None:
            return None
        return max(0.0, ((now or utcnow()) - self.oldest).total_seconds())


def waiting_in(runner: JobRunner, tconn: sa.Connection, sconn: sa.Connection, source: Any, cp: Any) -> Waiting:
    """Rows of `source` still to move, after the checkpoint `cp` or (scan) not in the ledger."""
    if source.cursor == "scan":
        return _unrecorded(runner, tconn, source, source.iter_sent(sconn))
    if source.cursor == "queue":
        count = source.count_after(sconn, None)
        return Waiting(count, source.oldest_after(sconn, None) if count else None)
    past = beyond_checkpoint(runner, tconn, sconn, source, cp.high if cp else None)
    return Waiting(past.waiting, source.oldest_after(sconn, past.oldest_after) if past.waiting else None)


def _unrecorded(runner: JobRunner, tconn: sa.Connection, source: Any, keys: Iterator[tuple[Any, datetime | None]]) -> Waiting:
    """A scan source's (key, when sent) walked against the ledger: how many it lacks, and the oldest of them."""
    count, oldest = 0, None
    for chunk in chunked((str(k), sent) for k, sent in keys):
        known = runner.ledger_lookup(tconn, source, [k for k, _ in chunk])
        for k, sent in chunk:
            if k not in known:
                count += 1
                if sent is not None and (oldest is None or sent < oldest):
                    oldest = sent
    return Waiting(count, oldest)


class Beyond(NamedTuple):
    waiting: int  # rows past the checkpoint the ledger does not have: the backlog
    oldest_after: int | None  # the first of them is the first row after this key
    recorded: Counter[str]  # outcomes of the rows past the checkpoint that the ledger has
    gone: int = 0  # keys past the checkpoint the ledger has and the source no longer does (legacy cleanup)


def beyond_checkpoint(runner: JobRunner, tconn: sa.Connection, sconn: sa.Connection, source: Any, high: int | None) -> Beyond:
    """A ranged queue's rows past its checkpoint. Nearly always none of them is in the ledger: a
    count and a seek. An interrupted migration leaves some that are (its units recorded them, the
    checkpoint moves when the queue finishes), and then the keys past it are walked against the
    ledger, as many as the backlog (issue 46.5: verify said 30,000 waiting with 18,000 of them moved)."""
    recorded = runner.state.recorded_keys(tconn, runner.job.name, runner.origins[source.queue], beyond=high)
    entry = next(recorded, None)
    if entry is None:
        return Beyond(source.count_after(sconn, high), high, Counter())
    waiting, first, outcomes, gone = 0, None, Counter[str](), 0
    for key in source.keys_after(sconn, high):
        while entry is not None and entry[0] < key:
            gone += 1  # recorded, and gone from the source since
            entry = next(recorded, None)
        if entry is not None and entry[0] == key:
            outcomes[entry[1]] += 1
            entry = next(recorded, None)
        else:
            waiting += 1
            first = key if first is None else first
    gone += (entry is not None) + sum(1 for _ in recorded)
    return Beyond(waiting, None if first is None else first - 1, outcomes, gone)


def backlog_of(runner: JobRunner, tconn: sa.Connection, sconn: sa.Connection, source: Any, cp: Any) -> int:
    """Rows of `source` still to move (what a plan sizes itself by)."""
    if source.cursor == "scan":  # the count alone: no time read per key
        return _unrecorded(runner, tconn, source, ((k, None) for k in source.iter_keys(sconn))).rows
    if source.cursor == "queue":
        return int(source.count_after(sconn, None))
    return beyond_checkpoint(runner, tconn, sconn, source, cp.high if cp else None).waiting


def backlog(runner: JobRunner) -> dict[str, int]:
    with runner.target_engine.connect() as tconn, runner.source_engine.connect() as sconn:
        checkpoints = runner.state.read_checkpoints(tconn, runner.job.name)
        return {q: backlog_of(runner, tconn, sconn, s, checkpoints.get(q)) for q, s in runner.sources.items()}
