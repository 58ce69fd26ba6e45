"""What still waits in a source: how many rows (the backlog) and when the oldest of them was sent
(the lag's start), read as cheaply as each kind of source allows (issue 46.3).

- cursor "id" (NGinn): a count after the checkpoint, and the first row after it (an index seek);
- cursor "queue" (NServiceBus proxy queues): the tables' counts, and the head row's TimeSent;
- cursor "scan" (OpenJMS, BizTalk): one walk of every key against the ledger, as the count
  needs anyway, which reads each key's time beside it (acceptedTime, Spool.dtTimeStamp)."""

from __future__ import annotations

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
        count, oldest = 0, None
        for chunk in chunked((str(k), sent) for k, sent in source.iter_sent(sconn)):
            known = runner.ledger_lookup(tconn, source, [k for k, _ in chunk])
            for k, sent in chunk:
                if k not in known:
                    count += 1
                    if sent is not None and (oldest is None or sent < oldest):
                        oldest = sent
        return Waiting(count, oldest)
    after = None if source.cursor == "queue" or cp is None else cp.high
    count = source.count_after(sconn, after)
    return Waiting(count, source.oldest_after(sconn, after) if count else None)


def backlog_of(runner: JobRunner, tconn: sa.Connection, sconn: sa.Connection, source: Any, cp: Any) -> int:
    """Rows of `source` still to move (what a plan sizes itself by)."""
    if source.cursor == "scan":  # the count alone: no time read per key
        count = 0
        for chunk in chunked(str(k) for k in source.iter_keys(sconn)):
            count += len(chunk) - len(runner.ledger_lookup(tconn, source, chunk))
        return count
    return int(source.count_after(sconn, None if source.cursor == "queue" or cp is None else cp.high))


def backlog(runner: JobRunner) -> dict[str, int]:
    with runner.target_engine.connect() as tconn, runner.source_engine.connect() as sconn:
        checkpoints = runner.state.read_checkpoints(tconn, runner.job.name)
        return {q: backlog_of(runner, tconn, sconn, s, checkpoints.get(q)) for q, s in runner.sources.items()}
