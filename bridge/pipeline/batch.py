"""One batch: decode, map and write rows with their ledger entries in the caller's target
transaction. Common-case rows take the fast lane (Source.plain, Target.plain_envelope, no
CanonicalMessage); any other row, or any doubt, takes the validated path, which says what is
wrong with a row it quarantines."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from bridge import faults, tracing
from bridge.db import unique_violation
from bridge.errors import BadRow
from bridge.ledger.lane_entries import LaneEntries
from bridge.ledger.ranges import AlreadyRecorded
from bridge.ledger.state import LedgerEntry, Quarantined
from bridge.model import PlainMessage, message_ids
from bridge.pipeline.columnar import lane, takes_columns
from bridge.pipeline.job import JobSetup, LedgerConflict
from bridge.pipeline.refusals import refused, write_refusing
from bridge.pipeline.stats import PassStats
from bridge.sources import Source, SourceRow
from bridge.sources.fetched import ledger_keys
from bridge.targets.base import Skipped, Target
from bridge.timefmt import utcnow

log = logging.getLogger("qbridge.batch")


class Batch(JobSetup):
    """The batch step of JobRunner."""

    def _deliver(self, tconn: sa.Connection, source: Source, rows: Sequence[SourceRow], lock: bool, stats: PassStats,
                 known: dict[str, str] | None = None) -> list:
        """Decodes, maps and writes `rows` with their ledger entries in the caller's target
        transaction; returns the keys move mode may consume once it commits."""
        self.target.begin_batch(tconn)
        if self.job.reverse:  # the batch span points at the spans that sent these messages
            tracing.link_messages(r.values.get("headers") for r in rows)
        mapped = time.perf_counter()
        counted = replace(stats)
        outs, entries, quarantined, consume = self._settle(tconn, source, rows, lock, stats, known)
        stats.t_map += time.perf_counter() - mapped
        self.read_ahead.writing(source.queue)
        try:
            try:
                with tconn.begin_nested():
                    self.target.write(tconn, outs)
            except Exception as e:
                if not refused(e):
                    raise
                # A row the target cannot store: the batch again by the per-row lanes, and each row
                # the target refuses quarantined with what it refused (pipeline/refusals.py).
                stats.__dict__.update(counted.__dict__)
                outs, entries, quarantined, consume = self._refusing(tconn, source, rows, lock, stats, known)
            self.state.record(tconn, self.job.name, source.queue, self.origins[source.queue], entries, quarantined,
                              ranged=source.cursor == "monotonic")
        except (sa_exc.IntegrityError, AlreadyRecorded) as e:
            if isinstance(e, sa_exc.IntegrityError) and not unique_violation(e):
                raise
            raise LedgerConflict(
                f"another qbridge process delivered messages of {source.queue!r} at the same time; the batch is rolled back and retried"
            ) from None
        return consume

    def _settle(self, tconn: sa.Connection, source: Source, rows: Sequence[SourceRow], lock: bool, stats: PassStats,
                known: dict[str, str] | None, places: list[int] | None = None
                ) -> tuple[list[Any], list[LedgerEntry] | LaneEntries, list[Quarantined], list[Any]]:
        """What to write, the ledger entries, the quarantined rows and the keys to consume of a
        batch: the columnar lane's share first, where it takes one, then the per-row lanes' rest.
        The write is one LaneBatch in batch order where the lane took rows; else what `_process`
        gives, `places` filled as it fills it."""
        keys = ledger_keys(source, rows)
        if known is None:  # scan passes looked their keys up already (and pass {})
            known = self.state.known(tconn, self.origins[source.queue], keys, ranged=source.cursor == "monotonic")
        taken = lane(self, source, rows, keys, known, lock) if takes_columns(self, source) else None
        if taken is None:
            return self._process(tconn, source, rows, lock, stats, known, places, keys)
        faults.reached("lane_settled")  # a Spark test's proof that its executors' batches take the lane
        stats.delivered += taken.delivered
        stats.skipped += taken.skipped
        before = stats.delivered
        rest_at = (~taken.taken).nonzero()[0]
        rest = rest_at.tolist()
        rest_places: list[int] = []
        outs, more, quarantined, consumed = self._process(tconn, source, [rows[i] for i in rest], lock, stats, known,
                                                          rest_places, [keys[i] for i in rest])
        if taken.oldest is not None:
            lag = max(0.0, (utcnow() - taken.oldest).total_seconds())
            stats.lag_seconds = max(lag, stats.lag_seconds or 0.0) if stats.delivered > before else lag
        return [taken.write(rest_at, rest_places, outs)], taken.entries.with_rest(more), quarantined, taken.consume + consumed

    def _refusing(self, tconn: sa.Connection, source: Source, rows: Sequence[SourceRow], lock: bool, stats: PassStats,
                  known: dict[str, str] | None) -> tuple[list[Any], list[LedgerEntry], list[Quarantined], list[Any]]:
        """`_process` by the per-row lanes, written row group by row group under savepoints: what
        `_deliver` records, each row the target refused quarantined instead of delivered."""
        places: list[int] = []
        outs, entries, quarantined, consume = self._process(tconn, source, rows, lock, stats, known, places)
        refusals = write_refusing(tconn, self.target.write, outs)
        if not refusals:
            return [], entries, quarantined, consume
        at = {e.source_key: i for i, e in enumerate(entries) if e.outcome == "delivered"}
        keep_consume = lock and source.consumes_quarantined
        dropped: set[Any] = set()
        for index, reason in refusals:
            row = rows[places[index]]
            key = source.ledger_key(row)
            entry = entries[at[key]]
            entries[at[key]] = LedgerEntry(entry.message_id, key, "quarantined", None, reason)
            quarantined.append(Quarantined(entry.message_id, key, reason, source.raw(row)))
            stats.delivered -= 1
            stats.quarantined += 1
            if not keep_consume:
                dropped.add(row.key)
            log.warning("job=%s queue=%s key=%s: quarantined: %s", self.job.name, source.queue, key, reason)
        return [], entries, quarantined, [k for k in consume if k not in dropped] if dropped else consume

    def _process(self, tconn: sa.Connection, source: Source, rows: Sequence[SourceRow], lock: bool, stats: PassStats,
                 known: dict[str, str] | None = None, places: list[int] | None = None, keys: list[str] | None = None
                 ) -> tuple[list[Any], list[LedgerEntry], list[Quarantined], list[Any]]:
        """Decodes and maps `rows` one by one (fast lane, then validated path): what to write, the
        ledger entries, the quarantined rows and the keys to consume; `places`, when given, gets
        each written row's index in `rows`; `keys`: the rows' ledger keys, when known."""
        if keys is None:
            keys = ledger_keys(source, rows)
        ids = message_ids(source.system, self.database, source.queue, keys)
        if known is None:  # scan passes looked their keys up already (and pass {})
            known = self.state.known(tconn, self.origins[source.queue], keys, ranged=source.cursor == "monotonic")
        # Each row's outcome goes into `known` as it is settled: a later copy of the same key in
        # this batch (a reverse job's message an endpoint sent twice) counts as already there.
        known = dict(known)
        lane = self.lane_for(source)
        outs: list[Any] = []
        entries: list[LedgerEntry] = []
        quarantined: list[Quarantined] = []
        consume: list[Any] = []
        translated: frozenset[str] = getattr(source, "translated_headers", frozenset())
        take_quarantined = lock and source.consumes_quarantined
        now = utcnow()
        oldest = None
        ledger_target = self.target.ledger_target
        for place, (row, key, mid) in enumerate(zip(rows, keys, ids)):
            seen = known.get(key)
            if seen is not None:
                stats.already += 1
                if lock and row.consumable and (seen != "quarantined" or take_quarantined):
                    consume.append(row.key)
                continue
            fast = self.fast_map(source, row, mid, translated) if lane else None
            if fast is not None:
                result, sent = fast[0], fast[1].time_sent
            else:
                msg, result, reason = self.map_row(source, row, translated)
                if result is None:
                    quarantined.append(Quarantined(mid, key, reason, source.raw(row)))
                    entries.append(LedgerEntry(mid, key, "quarantined", None, reason))
                    known[key] = "quarantined"
                    stats.quarantined += 1
                    if take_quarantined and row.consumable:
                        consume.append(row.key)
                    continue
                sent = msg.time_sent
            if isinstance(result, Skipped):
                entries.append(LedgerEntry(mid, key, "skipped", None, result.reason))
                known[key] = "skipped"
                stats.skipped += 1
            else:
                outs.append(result)
                if places is not None:
                    places.append(place)
                entries.append(LedgerEntry(mid, key, "delivered", ledger_target(result)))
                known[key] = "delivered"
                stats.delivered += 1
                if oldest is None or sent < oldest:
                    oldest = sent
            if lock and row.consumable:
                consume.append(row.key)
        if oldest is not None:
            stats.lag_seconds = max(0.0, (now - oldest).total_seconds())
        return outs, entries, quarantined, consume

    def lane_for(self, source: Source) -> bool:
        """Whether rows of `source` try the fast lane: it is on, and source and target both have one."""
        return (self.fast_lane and type(source).plain is not Source.plain
                and type(self.target).plain_envelope is not Target.plain_envelope)

    def fast_map(self, source: Source, row: SourceRow, message_id: str, translated: frozenset[str]
                 ) -> tuple[Any, PlainMessage] | None:
        """(what the target makes of it, the plain message) by the fast lane: no CanonicalMessage.
        None when the row is not the common case, or anything at all goes wrong on the way: the
        validated path (`map_row`) then reads it again and says what is wrong."""
        try:
            msg = source.plain(row, message_id)
            if msg is None:
                return None
            out = self.target.plain_envelope(msg, translated)
        except Exception:  # noqa: BLE001 - the validated path reads the row again and says what is wrong
            return None
        return None if out is None else (out, msg)

    def map_row(self, source: Source, row: SourceRow, translated: frozenset[str] = frozenset()
                ) -> tuple[Any, Any, str]:
        """(message, what the target makes of it, "") or (None, None, why it is quarantined)."""
        try:
            msg = source.decode(row)
            return msg, self.target.envelope(msg, translated), ""
        except BadRow as e:
            return None, None, str(e)
        except Exception as e:  # a bug must not block the rows behind it: keep the row, say why
            log.exception("job=%s queue=%s key=%s: unexpected error while decoding", self.job.name, source.queue,
                          source.ledger_key(row))
            return None, None, f"unexpected {type(e).__name__}: {e}"
