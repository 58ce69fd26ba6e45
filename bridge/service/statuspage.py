"""The status page `qbridge run --listen` serves on `/`: every job and queue, an hour of lag and
throughput, and the quarantine with its reasons and groups; forms to pause and resume a job and to
replay or discard a failure group (bridge.service.page_actions). One self-contained HTML document
(no scripts, no fonts or libraries fetched from elsewhere), reloaded by the browser itself.

The hour of history is kept in memory, per minute: it starts empty when `qbridge run` starts
and costs at most 60 buckets per queue. The numbers in the tables come from the same `status()`
that `qbridge status --json` prints (through the listener's StatusCache).
"""

from __future__ import annotations

import html
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bridge.db import reading
from bridge.ledger.steering import Steering
from bridge.pipeline.stats import PassStats
from bridge.service.view import WorkerView

if TYPE_CHECKING:
    from bridge.service.page_actions import PageActions
from bridge.timefmt import UTC

HOUR = 60  # minutes of history kept
REFRESH_SECONDS = 10
# The page reloads itself, but never under an operator's hands: not while a form's field has the
# focus or holds what someone typed (a reload wiped a half-typed "why"); it tries again 10 s on.
# What an action said is shown once: the reload drops it from the address.
RELOAD = ("setInterval(function(){var a=document.activeElement;if(a&&/^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName))return;"
          "var f=document.querySelectorAll('form input:not([type=hidden])');for(var i=0;i<f.length;i++)if(f[i].value)return;"
          "var u=new URL(location.href);u.searchParams.delete('said');location.replace(u.toString());},SECONDS);")
QUARANTINE_SHOWN = 200  # newest first; the rest are counted and left to `qbridge quarantine list`


@dataclass
class Minute:
    start: int  # epoch minute
    delivered: int = 0
    lag: float | None = None  # the largest lag seen in that minute


class History:
    """Per job, the last hour in one-minute buckets: messages delivered and the largest lag."""

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self._jobs: dict[str, deque[Minute]] = {}
        self._lock = threading.Lock()

    def _bucket(self, job: str) -> Minute:
        now = int(self.clock() // 60)
        minutes = self._jobs.setdefault(job, deque(maxlen=HOUR))
        if not minutes or minutes[-1].start != now:
            minutes.append(Minute(now))
        while minutes and minutes[0].start <= now - HOUR:
            minutes.popleft()
        return minutes[-1]

    def batch(self, job: str, stats: PassStats) -> None:
        with self._lock:
            m = self._bucket(job)
            m.delivered += stats.delivered
            if stats.lag_seconds is not None:
                m.lag = max(m.lag or 0.0, stats.lag_seconds)

    def lag(self, job: str, seconds: float | None) -> None:
        """The lag `status()` reports now: keeps the line going while nothing is delivered."""
        if seconds is None:
            return
        with self._lock:
            m = self._bucket(job)
            m.lag = max(m.lag or 0.0, seconds)

    def series(self, job: str) -> list[Minute]:
        """The last hour, one entry per minute, oldest first (minutes without data are empty)."""
        with self._lock:
            now = int(self.clock() // 60)
            have = {m.start: m for m in self._jobs.get(job, ())}
        return [have.get(s, Minute(s)) for s in range(now - HOUR + 1, now + 1)]


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _lag(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def chart(job: str, series: list[Minute]) -> str:
    """An SVG of the hour: bars of messages delivered per minute, a line of the largest lag; a
    sentence instead of an empty frame when the job moved nothing and lagged nothing."""
    if not any(m.delivered or m.lag for m in series):
        return (f'<p class="idle" data-job="{_e(job)}">Idle: no messages moved and no lag in the last hour '
                "(or since this process started).</p>")
    w, h, pad = 720, 180, 36
    inner_w, inner_h = w - 2 * pad, h - 2 * pad
    top_n = max([m.delivered for m in series] + [1])
    top_lag = max([m.lag for m in series if m.lag is not None] + [1.0])
    step = inner_w / len(series)
    bars: list[str] = []
    points: list[tuple[str, str]] = []
    for i, m in enumerate(series):
        x = pad + i * step
        if m.delivered:
            bh = inner_h * m.delivered / top_n
            bars.append(f'<rect class="throughput" x="{x + 1:.1f}" y="{pad + inner_h - bh:.1f}" width="{max(step - 2, 1):.1f}" '
                        f'height="{bh:.1f}"><title>{m.delivered} delivered in minute {_minute(m.start)}</title></rect>')
        if m.lag is not None:
            points.append((f"{x + step / 2:.1f}", f"{pad + inner_h - inner_h * m.lag / top_lag:.1f}"))
    line = f'<polyline class="lag" points="{" ".join(f"{px},{py}" for px, py in points)}"/>' if points else ""
    dots = "".join(f'<circle class="lag" cx="{px}" cy="{py}" r="2"/>' for px, py in points)
    return (
        f'<svg class="chart" data-job="{_e(job)}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        f'aria-label="lag and throughput of {_e(job)} over the last hour">'
        f'<rect class="frame" x="{pad}" y="{pad}" width="{inner_w}" height="{inner_h}"/>'
        f'{"".join(bars)}{line}{dots}'
        f'<text x="{pad}" y="{pad - 8}" class="axis">messages/min (bars, max {top_n})</text>'
        f'<text x="{w - pad}" y="{pad - 8}" class="axis lagaxis" text-anchor="end">lag (line, max {top_lag:.1f} s)</text>'
        f'<text x="{pad}" y="{h - 10}" class="axis">{_minute(series[0].start)} UTC</text>'
        f'<text x="{w - pad}" y="{h - 10}" class="axis" text-anchor="end">{_minute(series[-1].start)} UTC</text>'
        "</svg>"
    )


def _minute(epoch_minute: int) -> str:
    return datetime.fromtimestamp(epoch_minute * 60, UTC).strftime("%H:%M")


STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#1d2430}
h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.6em 0 .4em}
.meta{color:#5a6472;margin-bottom:1em}
table{border-collapse:collapse;margin:.4em 0} th,td{border:1px solid #d5dae1;padding:.3em .6em;text-align:left}
th{background:#f1f4f8} td.n{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b3261e;font-weight:600} .ok{color:#1e7a3c} .warn{color:#a15c00;font-weight:600}
svg.chart{background:#fbfcfd;border:1px solid #d5dae1;margin:.4em 0}
rect.frame{fill:none;stroke:#d5dae1} rect.throughput{fill:#7aa7e0}
polyline.lag{fill:none;stroke:#c2410c;stroke-width:2} circle.lag{fill:#c2410c}
text.axis{font-size:11px;fill:#5a6472} text.lagaxis{fill:#c2410c}
form.act{display:inline-flex;gap:.3em;margin:0 .3em 0 0} form.act input{font:inherit;padding:.1em .3em}
p.idle{color:#5a6472;font-style:italic} p.said{background:#eef6ee;padding:.4em .6em;border:1px solid #cfe3cf}
td.reason{max-width:48em;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}
"""


def render(title: str, workers: Sequence[WorkerView], history: History, books_of: Callable[[WorkerView], dict[str, Any]],
           actions: PageActions | None = None, query: str = "", said: str | None = None) -> str:
    """The whole page; `books_of` gives a job's `status()` (the listener's shared reading);
    `actions` adds the forms that act (pause, resume, replay and discard a group), each posting
    to `/actions/...` with `query` (the token, where one opened the page) and the CSRF token."""
    parts = []
    overview: list[str] = []
    groups_html: list[str] = []
    quarantine_rows: list[tuple[str, dict[str, Any]]] = []
    quarantine_total = 0
    for w in workers:
        job = w.name
        direction = "legacy → NServiceBus" if not w.runner.job.reverse else "NServiceBus → legacy"
        try:
            books = books_of(w)
            error = books["source_error"]
        except Exception as e:  # noqa: BLE001 - one database down must not take the page with it
            books, error = None, str(getattr(e, "orig", None) or e).splitlines()[0]
        history.lag(job, books["lag_seconds"] if books else None)
        steering = books.get("steering") if books else None
        if w.stopped_reason:
            state = f"stopped: {w.stopped_reason}"
        elif w.failures:
            state = f"retrying after {w.failures} failed attempt(s): {w.last_error}"
        elif steering and steering["paused"]:
            state = f"paused by {steering['paused_by']} since {_iso(steering['paused_at'])}: {steering['why']}"
        elif steering and steering["held"]:
            since = f" since {_iso(steering['held_since'])}" if steering["held_since"] else ""
            state = f"held: {steering['held']}{since}; {steering['held_seconds']:,.0f} s held before this hold"
        else:
            state = "running"
        if books and books.get("max_rate"):
            state += f" · max_rate {books['max_rate']}"  # throttled: the rate it is held to
        overview.append(_overview_row(w, direction, state, books, steering, actions, query))
        parts.append(f'<h2 id="job-{_e(job)}">{_e(job)} <small>({_e(direction)}, {_e(w.runner.job.mode)})</small></h2>')
        parts.append(f'<div class="meta">state: <span class="{tone(w, steering)}">'
                     f'<span class="state" data-job="{_e(job)}">{_e(state)}</span></span> · lock held by: <span class="lock" data-job="{_e(job)}">{_e(w.lock.holder())}</span>'
                     + (f' · last success {_e(_when(w.last_success))}' if w.last_success else "") + "</div>")
        if error:
            parts.append(f'<p class="bad">database unreachable or failing: {_e(error)}</p>')
        if books:
            parts.append(_queue_table(job, books))
        parts.append(chart(job, history.series(job)))
        try:  # the newest only, without their raw rows: this runs on every reload
            with reading(w.runner.target_engine) as conn:
                rows = w.runner.state.quarantined(conn, job, raw=False, newest=QUARANTINE_SHOWN)
        except Exception:  # noqa: BLE001 - the page shows what it can
            rows = []
        quarantine_total += books["quarantined"] if books else len(rows)  # the ledger's count, as in the table above
        quarantine_rows += [(job, r) for r in rows]
        try:
            with reading(w.runner.target_engine) as conn:
                paused = Steering.from_json(job, steering) if steering and steering["paused"] else None
                refused = paused.replay_refused() if paused else None
                groups_html += [_group_row(job, g, actions, query, refused) for g in w.runner.state.failure_groups(conn, job)]
        except Exception:  # noqa: BLE001, S110 - the page shows what it can
            pass
    quarantine_rows.sort(key=lambda jr: jr[1]["at"], reverse=True)
    parts.append(f'<h2 id="quarantine">Quarantine <small>({quarantine_total})</small></h2>')
    if groups_html:
        parts.append('<table class="groups"><tr><th>group</th><th>job/queue</th><th>messages</th><th>first seen</th>'
                     f'<th>last seen</th><th>a reason</th>{"<th>act</th>" if actions else ""}</tr>{"".join(groups_html)}</table>')
    if actions is not None and actions.lines():
        parts.append('<ul class="operations">' + "".join(f"<li>{_e(line)}</li>" for line in actions.lines()) + "</ul>")
    parts.append(_quarantine_table(quarantine_rows[:QUARANTINE_SHOWN], quarantine_total))
    head = ("<tr><th>job</th><th>direction</th><th>state</th><th>backlog</th><th>lag</th><th>delivered</th>"
            f"<th>quarantined</th>{'<th>act</th>' if actions else ''}</tr>")
    parts.insert(0, f'<table class="overview">{head}{"".join(overview)}</table>'
                 + (f'<p class="said">{_e(said)}</p>' if said else ""))
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><noscript><meta http-equiv="refresh" '
        f'content="{REFRESH_SECONDS}"></noscript><script>{RELOAD.replace("SECONDS", str(REFRESH_SECONDS * 1000))}</script>'
        f"<title>qbridge · {_e(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>qbridge · {_e(title)}</h1>"
        f'<div class="meta">as of <span id="generated">{now}</span> UTC · refreshes every {REFRESH_SECONDS} s · '
        f'history kept in memory since this process started · <a href="/metrics">/metrics</a> · '
        f'<a href="/status.json">/status.json</a></div>'
        + "".join(parts) + "</body></html>"
    )


def _iso(text: str) -> str:
    """An ISO 8601 UTC time as people read it: to the second, 'UTC' spelled out."""
    return text[:19].replace("T", " ") + " UTC"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


COLUMNS = (("backlog", "backlog"), ("lag", "lag_seconds"), ("delivered", "delivered"), ("skipped", "skipped"),
           ("quarantined", "quarantined"), ("open gaps", "open_gaps"), ("last run", "last_run"))


def _form(actions: PageActions, query: str, what: str, fields: dict[str, str], inputs: str, button: str) -> str:
    hidden = "".join(f'<input type="hidden" name="{_e(k)}" value="{_e(v)}">' for k, v in
                     {**fields, "csrf": actions.csrf()}.items())
    return (f'<form method="post" action="/actions/{what}{_e(query)}" class="act {what}">{hidden}{inputs}'
            f'<button type="submit">{_e(button)}</button></form>')


_BY = '<input name="by" placeholder="your name" size="10" required>'


def tone(w: WorkerView, steering: dict | None) -> str:
    """The colour of a state: red when it stopped or fails, amber while paused or held (nothing
    moves, on purpose or by back-pressure), green only while it runs."""
    if w.stopped_reason or w.failures:
        return "bad"
    return "warn" if steering and (steering["paused"] or steering["held"]) else "ok"


def _overview_row(w: WorkerView, direction: str, state: str, books: dict[str, Any] | None, steering: dict | None,
                  actions: PageActions | None, query: str) -> str:
    def n(key: str) -> str:
        value = books.get(key) if books else None
        return "?" if value is None else (_lag(value) if key == "lag_seconds" else f"{value:,}")

    act = ""
    if actions is not None:
        if steering and steering["paused"]:
            act = _form(actions, query, "resume", {"job": w.name}, _BY, "resume")
        else:
            act = _form(actions, query, "pause", {"job": w.name},
                        _BY + '<input name="why" placeholder="why" size="18" required>', "pause")
        act = f"<td>{act}</td>"
    return (f'<tr data-job="{_e(w.name)}"><td><a href="#job-{_e(w.name)}">{_e(w.name)}</a></td><td>{_e(direction)}</td>'
            f'<td class="{tone(w, steering)}" data-field="state">{_e(state)}</td><td class="n">{n("backlog")}</td>'
            f'<td class="n">{n("lag_seconds")}</td><td class="n">{n("rows_moved")}</td><td class="n">{n("quarantined")}</td>'
            f"{act}</tr>")


def _group_row(job: str, g: dict[str, Any], actions: PageActions | None, query: str, refused: str | None = None) -> str:
    """`refused`: why the group's replay is refused now (its job is paused): the button is
    disabled, and says so."""
    act = ""
    if actions is not None:
        fields = {"job": job, "group": g["group"] or ""}
        replay = (_form(actions, query, "replay-group", fields, _BY, "replay") if refused is None else
                  f'<button type="button" class="replay-refused" disabled title="{_e(refused)}">replay</button>'
                  f'<small class="refused">{_e(refused)}</small>')
        act = ("<td>" + replay
               + _form(actions, query, "discard-group", fields, _BY + '<input name="why" placeholder="why" size="14" required>',
                       "discard") + "</td>")
    return (f'<tr class="group" data-group="{_e(g["group"])}" data-job="{_e(job)}"><td><code>{_e(g["group"])}</code></td>'
            f'<td>{_e(job)}/{_e(g["queue"])}</td><td class="n">{g["count"]:,}</td><td>{_e(_iso(g["first_seen"]))}</td>'
            f'<td>{_e(_iso(g["last_seen"]))}</td><td class="reason">{_e(g["sample_reason"])}</td>{act}</tr>')


def _queue_table(job: str, books: dict[str, Any]) -> str:
    head = "".join(f"<th>{_e(label)}</th>" for label, _ in COLUMNS)
    body = []
    for q in books["queues"]:
        cells = []
        for _, key in COLUMNS:
            value = q[key]
            if key == "lag_seconds":
                shown = _lag(value)
            elif key == "last_run":
                shown = _iso(value) if value else "never"
            else:
                shown = "?" if value is None else value
            css = "n" if key != "last_run" else ""
            if key == "quarantined" and value:
                css += " bad"
            cells.append(f'<td class="{css}" data-field="{key}" data-value="{_e(value)}">{_e(shown)}</td>')
        body.append(f'<tr data-job="{_e(job)}" data-queue="{_e(q["queue"])}"><td>{_e(q["queue"])}</td>{"".join(cells)}</tr>')
    return f'<table class="queues"><tr><th>queue</th>{head}</tr>{"".join(body)}</table>'


def _quarantine_table(rows: list[tuple[str, dict[str, Any]]], total: int) -> str:
    if not rows:
        return "<p>Nothing is quarantined.</p>"
    body = "".join(
        f'<tr class="quarantined" data-message-id="{_e(r["message_id"])}"><td>{_e(job)}</td><td>{_e(r["queue"])}</td>'
        f'<td>{_e(r["source_key"])}</td><td>{_e(r["message_id"])}</td><td>{_e(_iso(r["at"]))}</td>'
        f'<td class="reason">{_e(r["reason"])}</td></tr>'
        for job, r in rows
    )
    more = (f"<p>{total - len(rows)} older ones are not shown: <code>qbridge quarantine list</code> has them all.</p>"
            if total > len(rows) else "")
    return ("<table><tr><th>job</th><th>queue</th><th>source key</th><th>message id</th><th>since</th><th>reason</th></tr>"
            f"{body}</table>{more}<p>Replay after fixing the mapping: <code>qbridge quarantine replay -c CONFIG --id ID</code>; "
            "give up with a reason: <code>qbridge quarantine discard -c CONFIG --id ID --why TEXT</code>.</p>")
