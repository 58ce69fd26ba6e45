"""`qbridge quarantine list|show|replay|discard|history`: the operator's side of the quarantine
(bridge.lifecycle.quarantine does the work)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from bridge.commands.common import err, out, runners_of
from bridge.errors import UsageError
from bridge.ledger.state import QuarantineFilter
from bridge.timefmt import naive_utc, parse_duration, utcnow

NO_REASON = "(no reason given)"
SUMMARY_ABOVE = 50  # results of replay/discard listed one by one up to this many, then summed up
PROGRESS_EVERY = 10.0  # seconds between progress lines of a replay or discard without a terminal


def selection(args: argparse.Namespace) -> QuarantineFilter:
    """--group, --queue, --type and --since as one filter."""
    since = None
    if args.since:
        since = parse_since(args.since)
    return QuarantineFilter(group=args.group, queue=args.queue, mentions=args.type, since=since)


def parse_since(text: str) -> datetime:
    """--since: an ISO time (UTC unless it says otherwise) or a duration back from now ("2h")."""
    try:
        return naive_utc(utcnow()) - timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r}: give a time (2026-11-25T08:00, UTC unless it says otherwise) or how long "
                         "ago (30m, 2h, 1d)") from None
    return naive_utc(when if when.tzinfo else when.replace(tzinfo=UTC))


def quarantine_command(args: argparse.Namespace) -> int:
    where = selection(args)
    if args.action in ("show", "replay", "discard") and not (args.ids or args.all or where):
        raise UsageError(f"quarantine {args.action} needs --id ID... (see `qbridge quarantine list`) or --all, or filters: "
                         "--group G (see `qbridge quarantine groups`), --queue, --type, --since")
    if args.ids and (args.all or where):
        raise UsageError(f"quarantine {args.action}: give --id, or --all, or filters (--group, --queue, --type, --since), "
                         "not --id with the others")
    if args.action == "groups":
        return _groups(args, where)
    if args.action == "discard" and not (args.why or "").strip():
        # The command line GUIDE.md promises works without --why; the audit trail says so.
        args.why = NO_REASON
        err.print(f"qbridge: discarding without --why: the audit trail records {NO_REASON!r}", markup=False, highlight=False)
    if (args.raw and args.action != "show") or (args.edited and args.action != "replay"):
        raise UsageError("--raw goes with `quarantine show`, --with FILE with `quarantine replay`")
    if args.edited:
        return _replay_edited(args)
    if args.action in ("replay", "discard"):
        return _quarantine_settle(args)
    if args.action == "history":
        return _quarantine_history(args)
    _, runners = runners_of(args)
    jobs: list[dict[str, Any]] = []
    for r in runners:
        with r.target_engine.connect() as conn:
            rows = r.state.quarantined(conn, r.job.name, args.ids, raw=args.action == "show", where=where or None)
        jobs.append({"job": r.job.name, "quarantined": rows})
    missing = _not_in_quarantine(args.ids, {v for j in jobs for row in j["quarantined"]
                                            for v in (row["message_id"], row["source_key"])})
    if args.raw:
        raws = {row["message_id"]: row["raw"] for j in jobs for row in j["quarantined"]}
        shown = next(iter(raws.values())) if len(raws) == 1 else raws
        sys.stdout.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n")
    elif args.json:
        sys.stdout.write(orjson.dumps({"jobs": jobs}).decode() + "\n")
    elif args.action == "list":
        t = Table(title="qbridge quarantine")
        for col in ("job", "queue", "source key", "message id", "since", "reason"):
            t.add_column(col)
        for j in jobs:
            for row in j["quarantined"]:
                t.add_row(j["job"], row["queue"], row["source_key"], row["message_id"], row["at"], row["reason"])
        out.print(t)
    else:
        out.print_json(data={"jobs": jobs})
    return 1 if missing else 0


def _said(where: QuarantineFilter) -> str:
    """The filters as the command line gave them."""
    parts = [f"--group {where.group}" if where.group else "", f"--queue {where.queue}" if where.queue else "",
             f"--type {where.mentions}" if where.mentions else "", f"--since {where.since:%Y-%m-%d %H:%M:%S} UTC"
             if where.since else ""]
    return " ".join(p for p in parts if p)


def _message_ids(ids: list[str], runners: list[Any]) -> list[str]:
    """The message ids `ids` name: each a message id, or a source key as `list` shows it (the one
    message in quarantine with that key; a key several queues share must be given as the id)."""
    out: list[str] = []
    for given in ids:
        rows = []
        for r in runners:
            with r.target_engine.connect() as conn:
                rows += [(r.job.name, row) for row in r.state.quarantined(conn, r.job.name, [given], raw=False)]
        by_id = [row["message_id"] for _, row in rows if row["message_id"] == given]
        if by_id or not rows:
            out.append(given)  # a message id, or not in quarantine (said as such afterwards)
        elif len(rows) == 1:
            out.append(rows[0][1]["message_id"])
        else:
            raise UsageError(f"--id {given}: source key {given!r} names {len(rows)} quarantined messages ("
                             + ", ".join(f"{job}/{row['queue']} {row['message_id']}" for job, row in rows)
                             + "): give the message id")
    return out


def _not_in_quarantine(ids: list[str] | None, found: set[str]) -> list[str]:
    """The asked-for ids that were not found, said on stderr."""
    missing = [i for i in (ids or []) if i not in found]
    if missing:
        err.print(f"qbridge: not in quarantine: {', '.join(missing)}", markup=False, highlight=False)
    return missing


def _replay_edited(args: argparse.Namespace) -> int:
    """`replay --id ID --with FILE`: one message, from an operator's edited copy of its raw row."""
    from bridge.lifecycle.quarantine import QuarantineDesk, operator

    if not args.ids or len(args.ids) != 1:
        raise UsageError("quarantine replay --with FILE replays one message: give exactly one --id")
    path = Path(args.edited)
    try:
        edited = orjson.loads(path.read_bytes())
    except OSError as e:
        raise UsageError(f"--with {path}: cannot read it ({e.strerror})") from None
    except orjson.JSONDecodeError as e:
        raise UsageError(f"--with {path}: not JSON ({e}); start from `qbridge quarantine show --id ID --raw`") from None
    if not isinstance(edited, dict):
        raise UsageError(f"--with {path}: a JSON object of the row's columns is expected, not {type(edited).__name__}")
    _, runners = runners_of(args)
    args.ids = _message_ids(args.ids, runners)
    actor = (args.by or "").strip() or operator()
    tally = _Tally(keep_all=True)
    for r in runners:
        for o in QuarantineDesk(r, actor, (args.why or "").strip() or None).replay_edited(args.ids[0], edited, args.even_if_paused):
            tally.add(o)
    return _settled(args, actor, tally)


class _Tally:
    """What a replay or discard did, in bounded memory: counts by (job, queue, did, now), how many
    failed again, and the outcomes themselves only as many as are shown one by one (or all, for
    --json or --id, which asked for each)."""

    def __init__(self, keep_all: bool) -> None:
        self.keep_all = keep_all
        self.kept: list = []
        self.counts: Counter = Counter()
        self.n = 0
        self.failed = 0

    def add(self, o) -> None:
        self.n += 1
        self.failed += o.action == "replay-failed"
        self.counts[(o.job, o.queue, o.action, o.outcome)] += 1
        if self.keep_all or len(self.kept) <= SUMMARY_ABOVE:
            self.kept.append(o)


def _quarantine_settle(args: argparse.Namespace) -> int:
    from bridge.lifecycle.quarantine import QuarantineDesk, operator

    _, runners = runners_of(args)
    actor = (args.by or "").strip() or operator()
    where = selection(args)
    if args.ids:
        args.ids = _message_ids(args.ids, runners)
    elif where:
        matched = 0
        for r in runners:
            with r.target_engine.connect() as conn:
                matched += sum(g["count"] for g in r.state.failure_groups(conn, r.job.name, where))
        if not matched:  # a misspelt group must not look like a replay that went well
            err.print(f"qbridge: nothing in quarantine matches {_said(where)}; `qbridge quarantine groups` lists the "
                      "groups, `qbridge quarantine list` the messages", markup=False, highlight=False)
            return 1
    stop = threading.Event()
    tally = _Tally(keep_all=bool(args.json or args.ids))
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())  # the message in hand commits, then it stops
    try:
        for r in runners:
            with r.target_engine.connect() as conn:
                total = sum(g["count"] for g in r.state.failure_groups(conn, r.job.name, where)) if not args.ids else len(args.ids)
            desk = QuarantineDesk(r, actor, (args.why or "").strip() or None)
            label = f"{args.action} {r.job.name}"
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal) as progress:
                task = progress.add_task(label, total=max(total, 1))
                said = _ProgressLines(label, total, enabled=not err.is_terminal)

                def each(o, t=task, said=said) -> None:
                    tally.add(o)
                    progress.advance(t)
                    said.advance()

                def waiting(why, t=task, label=label) -> None:  # held by back-pressure: said, not silent
                    progress.update(t, description=f"{label} (waiting: {why})" if why else label)
                    if why:
                        err.print(f"qbridge: {label}: waiting: {why} (Ctrl-C stops; what was replayed stays replayed)",
                                  markup=False, highlight=False)

                if args.action == "replay":
                    desk.replay(args.ids, where or None, on_each=each, should_stop=stop.is_set, keep=False,
                                even_if_paused=args.even_if_paused, on_wait=waiting)
                else:
                    desk.discard(args.ids, where or None, on_each=each, should_stop=stop.is_set, keep=False)
            if stop.is_set():
                break
    finally:
        signal.signal(signal.SIGINT, previous)
    if stop.is_set():
        err.print(f"qbridge: stopped after {tally.n:,} message(s); what was done stays done: run the same command "
                  "again to go on with the rest", markup=False, highlight=False)
    return _settled(args, actor, tally, stopped=stop.is_set())


class _ProgressLines:
    """Progress where no terminal shows a bar (a log, systemd's journal): a line at most every
    PROGRESS_EVERY seconds, so a long replay says how far it got without a line a message."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.done = 0
        self.next_at = time.monotonic() + PROGRESS_EVERY

    def advance(self) -> None:
        self.done += 1
        if self.enabled and time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + PROGRESS_EVERY
            err.print(f"qbridge: {self.label}: {self.done:,} of {self.total:,} messages", markup=False, highlight=False)


def _settled(args: argparse.Namespace, actor: str, tally: _Tally, stopped: bool = False) -> int:
    """What replay or discard did, as a table or JSON (a summary by outcome beyond SUMMARY_ABOVE
    messages); 1 if any failed or was not found, 130 if it was stopped."""
    missing = _not_in_quarantine(args.ids, {o.message_id for o in tally.kept})
    if args.json:
        sys.stdout.write(orjson.dumps({"actor": actor, "stopped": stopped, "results": [o.as_dict() for o in tally.kept]}).decode() + "\n")
    elif tally.n > SUMMARY_ABOVE:
        t = Table(title=f"qbridge quarantine {args.action} (by {actor}): {tally.n:,} messages")
        for col in ("job", "queue", "did", "now", "messages"):
            t.add_column(col, justify="right" if col == "messages" else "left")
        for (job, queue, did, now), n in sorted(tally.counts.items()):
            t.add_row(job, queue, did, now, f"{n:,}")
        out.print(t)
        if tally.failed:
            out.print(f"{tally.failed:,} failed again and stay quarantined; `qbridge quarantine groups` shows their reasons now",
                      markup=False, highlight=False)
    else:
        t = Table(title=f"qbridge quarantine {args.action}{' (edited)' if args.edited else ''} (by {actor})")
        for col in ("job", "queue", "message id", "did", "now", "detail"):
            t.add_column(col)
        for o in tally.kept:
            t.add_row(o.job, o.queue, o.message_id, o.action, o.outcome, o.detail)
        out.print(t)
    if stopped:
        return 130
    return 1 if tally.failed or missing else 0


def _groups(args: argparse.Namespace, where: QuarantineFilter) -> int:
    """`quarantine groups`: the quarantine by failure group, largest first."""
    _, runners = runners_of(args)
    jobs: list[dict[str, Any]] = []
    for r in runners:
        with r.target_engine.connect() as conn:
            jobs.append({"job": r.job.name, "groups": r.state.failure_groups(conn, r.job.name, where or None)})
    if args.json:
        sys.stdout.write(orjson.dumps({"jobs": jobs}).decode() + "\n")
        return 0
    t = Table(title="qbridge quarantine groups")
    for col in ("group", "job/queue", "messages", "first seen (UTC)", "last seen (UTC)", "a reason"):
        t.add_column(col, justify="right" if col == "messages" else "left")
    for j in jobs:
        for g in j["groups"]:
            t.add_row(g["group"] or "(run init)", f"{j['job']}/{g['queue']}", f"{g['count']:,}", g["first_seen"][:19].replace("T", " "),
                      g["last_seen"][:19].replace("T", " "), g["sample_reason"])
    out.print(t)
    return 0


def _quarantine_history(args: argparse.Namespace) -> int:
    from bridge.lifecycle.audit_trail import audit_trail

    _, runners = runners_of(args)
    jobs: list[dict[str, Any]] = []
    for r in runners:
        with r.target_engine.connect() as conn:
            jobs.append({"job": r.job.name, "history": audit_trail(r.state, conn, r.job.name, args.ids)})
    if args.json:
        sys.stdout.write(orjson.dumps({"jobs": jobs}).decode() + "\n")
        return 0
    t = Table(title="qbridge quarantine history")
    for col in ("at (UTC)", "job/queue", "message id", "did", "by", "why", "reason"):
        t.add_column(col)
    for j in jobs:
        for h in j["history"]:
            did = f"{h['action']} → {h['detail']}" if h["action"] == "replayed" else h["action"]
            reason = h["detail"] if h["action"] == "replay-failed" else h["reason"]  # the reason it has now, or had
            t.add_row(h["at"][:19].replace("T", " "), f"{j['job']}/{h['queue']}", h["message_id"], did, h["actor"],
                      h["why"] or "", reason)
    out.print(t)
    return 0


