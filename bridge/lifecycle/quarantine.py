"""`qbridge quarantine replay|discard`: what an operator does about a quarantined message.

Replay reads the kept raw row again with the job's current mapping (the operator fixed the
mapping, or the code) and delivers it in one target transaction that also turns its ledger
entry from quarantined into delivered (or skipped) and moves the quarantine row into the audit
trail. The ledger row is locked and checked first, so two operators, or an operator and a
running `qbridge run`, can never deliver it twice. A row that still fails stays quarantined
with its new reason. Discard records who and why, and makes the ledger entry a skip, so that
`verify` keeps balancing: nothing leaves the quarantine without a line in the audit trail.
"""

from __future__ import annotations

import getpass
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa

from bridge import faults, tracing
from bridge.codecs.jsonsafe import ascii_text, raw_json, writable
from bridge.db import unique_violation
from bridge.ledger.failure_groups import group_of
from bridge.ledger.state import QuarantineFilter
from bridge.ledger.totals import RELEASED, counted
from bridge.lifecycle.replay_gate import Gate
from bridge.model import message_id_for, queue_origin
from bridge.pipeline.loop import JobRunner
from bridge.pipeline.refusals import write_refusing
from bridge.targets.base import Skipped
from bridge.targets.bulk import write_in_any_charset
from bridge.timefmt import naive_utc, utcnow

log = logging.getLogger("qbridge.quarantine")
PAGE = 500  # quarantined rows (with their raw rows) read at a time by replay and discard


def operator() -> str:
    """Who is at the keyboard, for the audit trail."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in the environment (a container): say so rather than guess
        return "unknown"


@dataclass
class Outcome:
    """What replay or discard did to one quarantined message."""

    job: str
    queue: str
    message_id: str
    source_key: str
    action: str  # replayed | replay-failed | discarded | not-quarantined
    outcome: str  # the ledger's word afterwards
    detail: str

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


_ABSENT = object()  # a column the kept or the edited row does not have


class _AlreadyThere(Exception):
    """The target holds the message's id already (the transaction was rolled back)."""


class QuarantineDesk:
    """Replay and discard for one job, against its target database."""

    def __init__(self, runner: JobRunner, actor: str, why: str | None) -> None:
        self.runner = runner
        self.state = runner.state
        self.actor = actor
        self.why = why
        self._origins: dict[str, int] = {}  # message id -> its ledger entry's origin, while it is settled
        self._settled: set[tuple[str, int]] = set()  # (queue, origin) whose totals took rows since the last fold
        self.state.audit.create(runner.target_engine, checkfirst=True)  # a database set up before the audit trail existed

    def replay(self, ids: list[str] | None, where: QuarantineFilter | None = None,
               on_each: Callable[[Outcome], None] = lambda o: None, should_stop: Callable[[], bool] = lambda: False,
               keep: bool = True, even_if_paused: bool = False,
               on_wait: Callable[[str | None], None] = lambda why: None) -> list[Outcome]:
        """Each message `ids` or `where` names, one target transaction each, a page of PAGE read
        at a time; `should_stop` is asked between messages (a stopped replay is resumed by
        running it again: what was replayed has left the quarantine).

        A replay delivers as a pass does, so it is steered as one (issue 45): a paused job's
        messages are refused (JobPaused, who paused it and why) unless `even_if_paused`; it keeps
        to `max_rate` and waits while a destination queue holds its `max_target_depth`, telling
        `on_wait` why it waits (and None once it goes on)."""
        gate = Gate(self.runner, even_if_paused, on_wait, should_stop)
        gate.refuse_if_paused()

        def one(q: dict[str, Any]) -> Outcome:
            gate.wait()
            if should_stop():
                return Outcome(self.runner.job.name, q["queue"], q["message_id"], q["source_key"], "not-replayed",
                               "quarantined", "stopped before it was replayed")
            o = self._replay_one(q)
            gate.spent(o)
            return o

        one.__name__ = "replay"
        return self._each(ids, where, one, on_each, should_stop, keep, replay=True)

    def _each(self, ids: list[str] | None, where: QuarantineFilter | None, act: Callable[[dict[str, Any]], Outcome],
              on_each: Callable[[Outcome], None], should_stop: Callable[[], bool], keep: bool,
              replay: bool = False) -> list[Outcome]:
        """The outcomes (none kept with `keep=False`: a group of a million is settled in bounded
        memory, its outcomes seen one by one through `on_each`)."""
        name = "qbridge.quarantine.replay" if replay else "qbridge.quarantine.discard"
        with tracing.span(name, job=self.runner.job.name, group=where.group if where else None, actor=self.actor) as s:
            out: list[Outcome] = []
            messages = failed_again = 0
            for o in self._acted(ids, where, act, should_stop):
                if o.action == "not-replayed":  # stopped while it waited
                    break
                messages += 1
                failed_again += o.action == "replay-failed"
                if keep:
                    out.append(o)
                on_each(o)
            s.set_attributes({"qbridge.messages": messages, "qbridge.failed_again": failed_again})
            return out

    def _acted(self, ids: list[str] | None, where: QuarantineFilter | None, act: Callable[[dict[str, Any]], Outcome],
               should_stop: Callable[[], bool]) -> Iterator[Outcome]:
        """`act` on each row picked, until `should_stop` says so (asked before each); the totals
        folded after each page."""
        for page in self._pages(ids, where):
            try:
                for q in page:
                    if should_stop():
                        return
                    yield act(q)
            finally:
                self._fold()

    def _fold(self) -> None:
        """Folds the totals of the queues settled since the last fold, under each queue's checkpoint
        lock as a pass folds them (ledger/totals.py). Every message settled adds its moves as rows
        in its own transaction; left to the passes, a group of a million kept three million rows
        for `status` to sum where the job runs seldom, or not at all. A queue no longer in the job
        has no pass and no checkpoint to lock: its rows stay, as many as it had in quarantine."""
        r = self.runner
        settled, self._settled = self._settled, set()
        for queue, origin in sorted(settled):
            if queue not in r.sources:
                continue
            try:
                with r.target_engine.begin() as tconn:
                    r.state.lock_checkpoint(tconn, r.job.name, queue)
                    r.state.totals.fold(tconn, r.job.name, queue, origin)
            except (sa.exc.SQLAlchemyError, RuntimeError) as e:  # unfolded, the counts are right: the next pass
                # folds (RuntimeError: the queue has no checkpoint row, so no lock to fold under)
                log.warning("job=%s queue=%s: the totals were not folded after a replay or discard (%s); the "
                            "queue's next pass folds them", r.job.name, queue, e)

    def _pages(self, ids: list[str] | None, where: QuarantineFilter | None) -> Iterator[list[dict[str, Any]]]:
        """The rows picked, oldest first, PAGE at a time (keyset paging: a row that fails again
        stays behind the cursor, and is not taken twice in one run)."""
        after = None
        while True:
            with self.runner.target_engine.connect() as conn:
                rows = self.state.quarantined(conn, self.runner.job.name, ids, where=where, after=after, limit=PAGE)
            if rows:
                yield rows
            if len(rows) < PAGE:
                return
            last = rows[-1]
            after = (naive_utc(datetime.fromisoformat(last["at"])), last["queue"], last["source_key"])

    def replay_edited(self, message_id: str, edited: dict[str, Any], even_if_paused: bool = False) -> list[Outcome]:
        """Replays one message from an operator's edited copy of its raw row (ServicePulse's edit
        and retry). The key and the source's identity columns are locked, so the message keeps
        its id and Outbox endpoints still de-duplicate; the audit trail keeps the row as it was
        kept, which columns changed and the row after the edit. The quarantine keeps the kept
        row should the edited one fail too."""
        Gate(self.runner, even_if_paused, lambda why: None, lambda: False).refuse_if_paused()
        out = []
        for q in self._rows([message_id]):
            source = self.runner.sources.get(q["queue"])
            kept = q["raw"]
            changed = sorted(k for k in set(kept) | set(edited) if kept.get(k, _ABSENT) != edited.get(k, _ABSENT))
            locked = [k for k in changed if source is not None and k in source.identity_fields]
            if locked:
                out.append(Outcome(self.runner.job.name, q["queue"], message_id, q["source_key"], "replay-failed", "quarantined",
                                   f"the edit changes {', '.join(locked)}, which identify the message (its id would "
                                   "change and Outbox endpoints could not de-duplicate it); nothing done"))
                continue
            edit = f"edited {', '.join(changed) or 'nothing'}; the row after the edit: {orjson.dumps(edited).decode()}"
            out.append(self._replay_one({**q, "raw": edited, "kept_raw": kept, "edit": edit}))
        return out

    def discard(self, ids: list[str] | None, where: QuarantineFilter | None = None,
                on_each: Callable[[Outcome], None] = lambda o: None, should_stop: Callable[[], bool] = lambda: False,
                keep: bool = True) -> list[Outcome]:
        return self._each(ids, where, self._discard_one, on_each, should_stop, keep)

    def _discard_one(self, q: dict[str, Any]) -> Outcome:
        with self.runner.target_engine.connect() as tconn, tconn.begin():
            if not self._still_quarantined(tconn, q):
                return self._gone(q)
            reason = f"discarded by {self.actor}: {self.why}"[:500]
            self._settle(tconn, q, "discarded", "skipped", reason, target=None, ledger_reason=reason)
        log.info("job=%s queue=%s message %s discarded by %s: %s", self.runner.job.name, q["queue"], q["message_id"],
                 self.actor, self.why)
        return Outcome(self.runner.job.name, q["queue"], q["message_id"], q["source_key"], "discarded", "skipped", reason)

    # -- one message -----------------------------------------------------------------------
    def _rows(self, ids: list[str] | None) -> list[dict[str, Any]]:
        with self.runner.target_engine.connect() as conn:
            return self.state.quarantined(conn, self.runner.job.name, ids)

    def _replay_one(self, q: dict[str, Any]) -> Outcome:
        r = self.runner
        job = r.job.name
        source = r.sources.get(q["queue"])
        if source is None:
            return Outcome(job, q["queue"], q["message_id"], q["source_key"], "replay-failed", "quarantined",
                           f"queue {q['queue']!r} is no longer in job {job!r}: put it back in the config to replay this message")
        def failed(why: str) -> Outcome:
            return Outcome(job, q["queue"], q["message_id"], q["source_key"], "replay-failed", "quarantined", why)

        try:
            row = source.from_raw(q["raw"], q["source_key"])
        except (KeyError, TypeError, ValueError) as e:
            return failed(f"the kept raw row cannot be read back ({type(e).__name__}: {e}); nothing done")
        if str(r.message_id(source, row)) != q["message_id"]:
            # The id comes from the source's identity (source.database or its URL): delivering
            # under another id than the ledger's would let the message arrive twice.
            return failed(f"the message id computed now differs from the ledger's: did jobs[].source.database or "
                          f"the source URL change since it was quarantined? (it is {r.database!r} now); nothing done")
        if r.target.reads_per_batch:  # what the target reads once per batch (an OpenJMS store's destinations)
            with r.target_engine.connect() as tconn:
                r.target.begin_batch(tconn)
        _, result, reason = r.map_row(source, row, getattr(source, "translated_headers", frozenset()))
        # Move mode consumes the legacy row once the message is out, as a pass does: the target
        # commits first, with the key in the checkpoint's pending list, so that if this process
        # dies before the legacy commit the job's next pass consumes it.
        consume = [row.key] if r.job.mode == "move" and row.consumable and not source.consumes_quarantined else []
        try:
            action, outcome, detail, version, consume = self._deliver(q, source.queue, result, reason, consume)
        except _AlreadyThere as e:
            return failed(str(e))
        if action == "not-quarantined":
            return self._gone(q)
        if consume:
            with r.source_engine.connect() as sconn, sconn.begin():
                source.consume(sconn, consume)
            self.state.settle_pending(r.target_engine, job, source.queue, consume, version)
        log.info("job=%s queue=%s message %s %s (%s) by %s", job, q["queue"], q["message_id"], action, detail, self.actor)
        return Outcome(job, q["queue"], q["message_id"], q["source_key"], action, outcome, detail)

    def _deliver(self, q: dict[str, Any], queue: str, result: Any, reason: str, consume: list[Any]
                 ) -> tuple[str, str, str, int | None, list[Any]]:
        """One target transaction: the message written, its ledger entry settled, the audit line,
        the legacy key left for consuming; returns with the key to consume (none if it stays
        quarantined) and the checkpoint version for settling it (None: others' keys pend too)."""
        r = self.runner
        version = None
        r._prepare(queue)
        with r.target_engine.connect() as tconn, tconn.begin():
            if not self._still_quarantined(tconn, q):
                return "not-quarantined", "", "", None, []
            if result is None:
                self._still_failing(tconn, q, reason)
                action, outcome, detail = "replay-failed", "quarantined", reason
            elif isinstance(result, Skipped):
                self._settle(tconn, q, "replayed", "skipped", result.reason, target=None, ledger_reason=result.reason)
                action, outcome, detail = "replayed", "skipped", result.reason
            else:
                r.target.begin_batch(tconn)
                try:
                    refusals = write_refusing(tconn, r.target.write, [result])
                except sa.exc.IntegrityError as e:
                    if not unique_violation(e):
                        raise
                    raise _AlreadyThere(f"a message with id {q['message_id']} is in the {r.target.system} tables already; "
                                        "left in quarantine, nothing written") from None
                if refusals:  # a value the target cannot store (pipeline/refusals.py): it stays where it is
                    action, outcome, detail = "replay-failed", "quarantined", refusals[0][1]
                    self._still_failing(tconn, q, detail)
                else:
                    where = r.target.ledger_target(result)
                    self._settle(tconn, q, "replayed", "delivered", where or "", target=where, ledger_reason=None)
                    action, outcome, detail = "replayed", "delivered", where or ""
            if outcome != "quarantined" and consume:
                # Only its own key is consumed here; others' pending keys are left to the next
                # pass's _consume_pending (so the settle takes the fast path only if it is alone).
                pending, version = self.state.add_pending(tconn, r.job.name, queue, consume)
                version = version if len(pending) == len(consume) else None
            else:
                consume = []
            faults.reached("replay_before_commit")
        faults.reached("replay_after_commit")
        return action, outcome, detail, version, consume

    def _still_quarantined(self, tconn: sa.Connection, q: dict[str, Any]) -> bool:
        """Locks the ledger entry; False when someone settled it since it was listed. Keeps the
        entry's origin for the totals its settling moves."""
        l = self.state.ledger
        stmt = sa.select(l.c.outcome, l.c.origin).where(self._entry(q))
        if tconn.dialect.name != "sqlite":
            stmt = stmt.with_for_update()
        row = tconn.execute(stmt).first()
        if row is None or row[0] != "quarantined":
            return False
        self._origins[q["message_id"]] = int(row[1])
        return True

    def _entry(self, q: dict[str, Any], origin: int | None = None) -> sa.ColumnElement[bool]:
        """The ledger entry of a quarantined message, by its primary key (origin, source key). A
        message quarantined under another source identity than today's (the replay refuses it;
        discard does not) has another origin: `origin` once the entry is locked, else found by
        its message id, job and key (the message id is not indexed: a scan) in a read that
        locks nothing, on a connection of its own, and then locked and changed by its primary
        key with its message id checked again. A scan that locked (SELECT ... FOR UPDATE,
        UPDATE) held every entry it passed on MariaDB and deadlocked with a pass writing its
        entries (bridge/ledger/innodb.py); the read in the caller's transaction would fix its
        snapshot before the lock, and with MariaDB's snapshot isolation (the default from 11.6)
        the lock of an entry another operator settled meanwhile failed with 1020, not "settled
        by someone else" (tests/review/test_pk_locks_review.py)."""
        r, l = self.runner, self.state.ledger
        system, queue, key = r.job.source.system, q["queue"], q["source_key"]
        if str(message_id_for(system, r.database, queue, key)) == q["message_id"]:
            return sa.and_(l.c.origin == queue_origin(system, r.database, queue), l.c.source_key == key)
        if origin is None:
            with r.target_engine.connect() as look:
                origin = look.execute(sa.select(l.c.origin).where(l.c.message_id == q["message_id"], l.c.job == r.job.name,
                                                                  l.c.queue == queue, l.c.source_key == key)).scalar()
        if origin is None:
            return sa.false()
        return sa.and_(l.c.origin == origin, l.c.source_key == key, l.c.message_id == q["message_id"])

    def _gone(self, q: dict[str, Any]) -> Outcome:
        return Outcome(self.runner.job.name, q["queue"], q["message_id"], q["source_key"], "not-quarantined", "",
                       "settled by someone else since it was listed; nothing done")

    def _still_failing(self, tconn: sa.Connection, q: dict[str, Any], reason: str) -> None:
        """The new reason, kept as the audit row is: in ASCII with escapes where the books'
        character set refuses it (an emoji in a type name, utf8mb3 books)."""
        s = self.state
        entry = self._entry(q, self._origins.pop(q["message_id"], None))  # locked by _still_quarantined

        def books(text: Callable[[str], str]) -> None:
            tconn.execute(sa.update(s.quarantine).where(s.quarantine.c.message_id == q["message_id"])
                          .values(reason=text(reason), grp=group_of(self.runner.job.name, q["queue"], writable(reason))))
            tconn.execute(sa.update(s.ledger).where(entry).values(reason=text(reason)[:500]))

        write_in_any_charset(tconn, books, not reason.isascii())
        self._audit(tconn, q, "replay-failed", "quarantined", reason)

    def _settle(self, tconn: sa.Connection, q: dict[str, Any], action: str, outcome: str, detail: str,
                target: str | None, ledger_reason: str | None) -> None:
        s = self.state
        origin = self._origins.pop(q["message_id"])  # the entry's, locked by _still_quarantined
        entry = self._entry(q, origin)

        def books(text: Callable[[str], str]) -> None:  # a discard's why, kept in any character set
            why = ledger_reason and text(ledger_reason)[:500]
            tconn.execute(sa.update(s.ledger).where(entry).values(outcome=outcome, target=target, reason=why,
                                                                  at=naive_utc(utcnow())))
            moved: Counter[tuple[str, str | None]] = Counter({("quarantined", None): -1, (RELEASED, None): 1})
            moved[counted(outcome, why)] += 1
            s.totals.add(tconn, self.runner.job.name, q["queue"], origin, moved)

        write_in_any_charset(tconn, books, not (ledger_reason or "").isascii())
        self._settled.add((q["queue"], origin))
        self._audit(tconn, q, action, outcome, detail)
        tconn.execute(sa.delete(s.quarantine).where(s.quarantine.c.message_id == q["message_id"]))

    def _audit(self, tconn: sa.Connection, q: dict[str, Any], action: str, outcome: str, detail: str) -> None:
        """One audit row in whatever character set the database has (as the quarantine row was
        kept), under a savepoint only where a text is not ASCII, which every character set stores."""
        def values(text: Callable[[str], str]) -> dict[str, Any]:
            return {"at": naive_utc(utcnow()), "job": self.runner.job.name, "queue": q["queue"], "message_id": q["message_id"],
                    "source_key": q["source_key"], "action": action, "outcome": outcome, "actor": self.actor,
                    "why": self.why and text(self.why), "reason": text(q["reason"]),
                    "detail": text(f"{detail} ({q['edit']})" if "edit" in q else detail),
                    "quarantined_at": naive_utc(datetime.fromisoformat(q["at"])),
                    "raw": raw_json(q.get("kept_raw", q["raw"]), ascii=text is ascii_text)}

        first = values(writable)
        not_ascii = any(isinstance(v, str) and not v.isascii() for v in first.values())
        write_in_any_charset(tconn, lambda text: tconn.execute(sa.insert(self.state.audit).values(
            first if text is writable else values(text))), not_ascii)

