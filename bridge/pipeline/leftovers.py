"""What passes left in the legacy store to consume (move mode): the keys a pass delivered and
then could not consume (it died, or lost its connection, between its two commits), kept in its
checkpoint; and the batches Spark units committed in the target and did not consume. The next
pass of the queue consumes them first (Passes)."""

from __future__ import annotations

import logging

from bridge import faults
from bridge.ledger.sqlite_order import sqlite_pass_order
from bridge.pipeline.batch import Batch

log = logging.getLogger("qbridge.batch")


class Leftovers(Batch):
    """Consuming what interrupted passes and units left, before a pass of the queue."""

    def _consume_pending(self, queue: str) -> None:
        """Consumes what a pass delivered and then could not consume (it died, or lost its
        connection, between its two commits), under the checkpoint's lock, in transactions of
        its own that hold no other source row: a pass still committing those rows finishes
        first, and nothing waits in a circle. Then what Spark units left in flight."""
        inflight = self.inflight_kept()  # first: it connects, and SQLite's BEGIN IMMEDIATE would wait on tconn
        with self.target_engine.connect() as tconn:
            cp = self.state.read_checkpoints(tconn, self.job.name).get(queue)
            flights = self.state.inflight.batches(tconn, self.job.name, queue) if inflight else []
        if cp is not None and cp.pending:
            self._consume_checkpoint_pending(queue)
        if flights:
            self._consume_inflight(queue, flights)

    def _consume_inflight(self, queue: str, flights: list[str]) -> None:
        """Consumes the keys of Spark units' batches that committed in the target, each as
        `_consume_checkpoint_pending` does its keys: under the checkpoint's lock (which a
        rollback's withdrawal and give-back take), the batch's row read again (a list read
        before may be stale: a rollback may have consumed it, withdrawn its messages and given
        their rows back since), and the fence checked before the legacy commit. A unit still
        between its two commits holds its rows, so this waits for its consume and finds them
        consumed; units take no checkpoint lock, so nothing waits in a circle."""
        n = 0
        for batch in flights:
            with sqlite_pass_order(self.source_url, self.target_url), \
                    self.source_engine.connect() as sconn, self.target_engine.connect() as tconn:
                stx = sconn.begin()  # first, as a pass's (SQLite takes a file's write lock at BEGIN)
                try:
                    with tconn.begin():
                        self.state.lock_checkpoint(tconn, self.job.name, queue)
                        self.fenced(tconn)  # held shared to the end: no taker raises the epoch meanwhile
                        keys = self.state.inflight.keys_of(tconn, self.job.name, queue, batch)
                        if keys is None:  # consumed and dropped by its unit or another process since
                            continue
                        n += self.sources[queue].consume(sconn, keys)
                        stx.commit()
                        faults.reached("inflight_consumed")
                        self.state.inflight.drop(tconn, self.job.name, queue, batch)
                finally:
                    if stx.is_active:
                        stx.rollback()
        if n:
            log.info("job=%s queue=%s consumed %d source rows delivered by a Spark unit that did not consume them",
                     self.job.name, queue, n)

    def _consume_checkpoint_pending(self, queue: str) -> None:
        # The source transaction begins first, as a pass's does: SQLite takes a file's write
        # lock at BEGIN, and two orders would wait on each other (two jobs sharing both files).
        with sqlite_pass_order(self.source_url, self.target_url), \
                self.source_engine.connect() as sconn, self.target_engine.connect() as tconn:
            stx = sconn.begin()
            try:
                with tconn.begin():
                    cp = self.state.lock_checkpoint(tconn, self.job.name, queue)
                    if not cp.pending:
                        stx.rollback()
                        return
                    self.fenced(tconn)  # before the legacy commit; held shared to the end
                    n = self.sources[queue].consume(sconn, cp.pending)
                    stx.commit()
                    faults.reached("pending_consumed")
                    self.state.drop_pending(tconn, cp, cp.pending)
            finally:
                if stx.is_active:
                    stx.rollback()
        log.info("job=%s queue=%s consumed %d source rows delivered by an interrupted pass", self.job.name, queue, n)
