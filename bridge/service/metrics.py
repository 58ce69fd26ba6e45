"""`qbridge run --listen HOST:PORT`: Prometheus metrics on `/metrics`, with the official client,
and the status page on `/` (bridge.service.statuspage) with its numbers as JSON on `/status.json`.

The per-queue numbers are read through the same `status()` that `qbridge status --json` prints,
so both agree by construction; the listener computes them at most once per 5 s per job
(bridge.service.status_cache), however many scrapes and page views arrive. What only the running process knows (batch
durations, retries, lock ownership, last success, the last hour) is kept by the scheduler's workers.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import Any, cast
from urllib.parse import parse_qs, urlencode
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.errors import UsageError
from bridge.ledger import job_state
from bridge.service.page_actions import PageActions
from bridge.service.status_cache import StatusCache
from bridge.service.statuspage import History, render
from bridge.service.view import WorkerView
from bridge.settings_io import is_loopback, loopback_host, parse_listen

log = logging.getLogger("qbridge.metrics")
TOKEN_ENV = "QBRIDGE_TOKEN"
BATCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class BridgeCollector(Collector):
    """Per job and queue, at scrape time, from the same books as `qbridge status --json`."""

    def __init__(self, workers: Sequence[WorkerView], books: Callable[[WorkerView], dict[str, Any]]) -> None:
        self.workers = workers
        self.books = books

    def collect(self) -> Iterable[Any]:
        messages = CounterMetricFamily("qbridge_messages", "Messages that ever had each outcome, from the ledger's "
                                       "totals: a replay, a discard or a rollback takes none off",
                                       labels=["job", "queue", "direction", "outcome"])
        quarantined = GaugeMetricFamily("qbridge_quarantined_messages", "Messages in quarantine now (replay and "
                                        "discard take them out)", labels=["job", "queue"])
        backlog = GaugeMetricFamily("qbridge_backlog_messages", "Messages waiting in the source", labels=["job", "queue"])
        lag = GaugeMetricFamily("qbridge_lag_seconds", "Age of the oldest message still waiting in the source (0 without backlog), paused or held alike",
                                labels=["job", "queue"])
        gaps = GaugeMetricFamily("qbridge_open_gaps", "Id gaps still watched for late commits", labels=["job", "queue"])
        held = GaugeMetricFamily("qbridge_job_lock_held", "1 while this process holds the job's lock", labels=["job"])
        success = GaugeMetricFamily("qbridge_last_success_timestamp_seconds", "When the job last ran without an error or committed a batch",
                                    labels=["job"])
        retries = CounterMetricFamily("qbridge_retries", "Failed runs retried after a back-off", labels=["job", "reason"])
        paused = GaugeMetricFamily("qbridge_job_paused", "1 while an operator has the job paused (qbridge pause)", labels=["job"])
        holding = GaugeMetricFamily("qbridge_job_held", "1 while back-pressure holds the job (a destination queue over "
                                    "max_target_depth)", labels=["job"])
        held_seconds = CounterMetricFamily("qbridge_job_held_seconds", "Seconds the job was held by back-pressure, in all",
                                           labels=["job"])
        rate = GaugeMetricFamily("qbridge_job_max_rate", "The job's max_rate in messages a second (no sample: no limit)",
                                 labels=["job"])
        throttled = CounterMetricFamily("qbridge_job_throttled_seconds", "Seconds the job's batches waited for its max_rate, in all",
                                        labels=["job"])
        states = GaugeMetricFamily("qbridge_job_state", "1 for the job's state now: running, paused, held, failing "
                                   "(retrying after errors) or stopped (on an error, until fixed)", labels=["job", "state"])
        for w in self.workers:
            job = w.name
            direction = "to_legacy" if w.runner.job.reverse else "to_nservicebus"
            read: dict[str, Any] | None
            try:
                books = read = self.books(w)
            except Exception as e:  # noqa: BLE001 - a database that is down must not break the scrape of the others
                log.warning("job=%s metrics: %s", job, str(getattr(e, "orig", None) or e).splitlines()[0])
                books, read = {"queues": []}, None
            for q in books["queues"]:
                labels = [job, q["queue"]]
                for outcome in ("delivered", "skipped", "quarantined"):
                    messages.add_metric([*labels, direction, outcome], q["ever"][outcome])
                quarantined.add_metric(labels, q["quarantined"])
                if q["backlog"] is not None:
                    backlog.add_metric(labels, q["backlog"])
                if q["lag_seconds"] is not None:
                    lag.add_metric(labels, q["lag_seconds"])
                gaps.add_metric(labels, q["open_gaps"])
            held.add_metric([job], 1.0 if w.lock.held else 0.0)
            now, _ = state_of(w, read)
            if now is not None:  # unknown (books unread): no state, rather than a "running" guessed
                for state in job_state.STATES:
                    states.add_metric([job, state], 1.0 if state == now else 0.0)
            steering = books.get("steering")
            if steering is not None:
                paused.add_metric([job], 1.0 if steering["paused"] else 0.0)
                holding.add_metric([job], 1.0 if steering["held"] else 0.0)
                since = w.runner.pressure.held_for()  # the hold under way, which the books count once it ends
                held_seconds.add_metric([job], steering["held_seconds"] + since)
            limit = w.runner.configured.rate_per_second
            if limit:
                rate.add_metric([job], limit)
            throttled.add_metric([job], w.runner.pace.waited)
            if w.last_success is not None:
                success.add_metric([job], w.last_success)
            for reason, n in sorted(w.retries.items()):
                retries.add_metric([job, reason], n)
        yield from (messages, quarantined, states, backlog, lag, gaps, held, success, retries, paused, holding, held_seconds,
                    rate, throttled)


def state_of(w: WorkerView, books: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(state, why) of a job this process runs: what it knows itself first (stopped, failing, or
    a run since it started, which makes the books' word of an earlier process old), else the
    books' (`status --json`'s: what the process running it wrote, a standby's view). Books None
    (they cannot be read): (None, None) unless stopped or failing, since paused and held are in
    the books, and a "running" would be a guess."""
    if w.stopped_reason:
        return "stopped", w.stopped_reason
    if w.failures:
        return "failing", w.last_error
    if books is None:
        return None, None
    if w.last_success is not None:
        return job_state.overall(job_state.RunState(), books.get("steering"))
    return books.get("state") or "running", books.get("state_reason")


def not_ready(workers: Sequence[WorkerView]) -> str | None:
    """Why this process is not ready (None: it is): for each job it runs, it must hold the job's
    lock (a standby is alive but not ready) and have finished a run or committed a batch lately
    (within three of its schedule's intervals, at least a minute)."""
    now = time.time()
    for w in workers:
        if w.stopped_reason:
            continue  # stopped for good on an error: /metrics and the page say so; the others may run
        if not w.lock.held:
            return f"job {w.name}: not holding its lock (standing by, or not started yet)"
        if w.last_success is None or now - w.last_success > w.allowance:
            ago = "never" if w.last_success is None else f"{now - w.last_success:.0f}s ago"
            return f"job {w.name}: last successful run {ago} (allowed {w.allowance:.0f}s)"
    return None


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """A thread per request: a browser's idle pre-opened connection must not hold up a scrape."""

    daemon_threads = True


class MetricsServer:
    """`/metrics`, `/`, `/status.json`, `/healthz` and `/readyz` on HOST:PORT in a daemon thread; the
    page's forms POST to `/actions/...` (bridge.service.page_actions), nothing else changes anything.
    A non-loopback address needs QBRIDGE_TOKEN, sent as `Authorization: Bearer <token>` or, from a
    browser, as `?token=<token>`."""

    def __init__(self, listen: str, workers: Sequence[WorkerView], title: str = "qbridge run",
                 alive: Callable[[], str | None] = lambda: None) -> None:
        host, port = parse_listen(listen)
        self.token = os.environ.get(TOKEN_ENV) or None
        if not is_loopback(host) and not self.token:
            raise UsageError(f"--listen {listen}: an address other than loopback needs a token; set {TOKEN_ENV} "
                             "(scrapers then send `Authorization: Bearer <token>`, browsers open /?token=<token>)")
        from bridge.lifecycle.verify import status

        cache = StatusCache(status)
        self.books: Callable[[WorkerView], dict[str, Any]] = lambda w: cache.get(w.name, w.runner)
        self.registry = CollectorRegistry()
        self.registry.register(BridgeCollector(workers, self.books))
        self.batch = Histogram("qbridge_batch_duration_seconds", "Seconds per committed batch", ["job"],
                               buckets=BATCH_BUCKETS, registry=self.registry)
        self.history = History()
        self.actions = PageActions(workers)
        for w in workers:
            w.runner.on_batch = lambda stats, job=w.name: self._on_batch(job, stats)
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            path = cast(str, environ.get("PATH_INFO"))  # wsgiref sets it on every request
            if path in ("/healthz", "/readyz"):  # no token: they say ok or why not, nothing else
                why = alive() if path == "/healthz" else (alive() or not_ready(workers))
                start_response("503 Service Unavailable" if why else "200 OK",
                               [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")])
                return [(why or "ok").encode() + b"\n"]
            if not self.token and not loopback_host(environ.get("HTTP_HOST")):
                # Open without a token only to this host's own names: a page of another site whose
                # name was re-pointed at 127.0.0.1 (DNS rebinding) must not read the page or post to it.
                start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8")])
                return [f"refused: Host {environ.get('HTTP_HOST')!r} is not a loopback name; open "
                        f"http://{listen}/ (or set {TOKEN_ENV})\n".encode()]
            if not self._authorized(environ):
                start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
                return [b"a token is required\n"]
            method = environ.get("REQUEST_METHOD", "GET")
            token_query = self._token_query(environ)
            if method == "POST" and path.startswith("/actions/"):
                status_line, text = self.actions.handle(environ)
                if status_line.startswith("303"):
                    cache.forget(environ.get("qbridge.job"))  # the page it is sent to shows what the action did to the job
                    said = urlencode({"said": text})
                    where = f"/{token_query}&{said}" if token_query else f"/?{said}"
                    start_response(status_line, [("Location", where), ("Content-Type", "text/plain; charset=utf-8")])
                else:
                    start_response(status_line, [("Content-Type", "text/plain; charset=utf-8")])
                return [text.encode() + b"\n"]
            if method not in ("GET", "HEAD"):
                start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")])
                return [b"only the status page's forms post, to /actions/...\n"]
            if path == "/metrics":
                return metrics(environ, start_response)
            if path == "/":
                said = (parse_qs(environ.get("QUERY_STRING", "")).get("said") or [None])[0]
                page = render(title, workers, self.history, self.books, self.actions, token_query, said).encode()
                start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")])
                return [page]
            if path == "/status.json":
                body = orjson.dumps({"jobs": [self._job_json(w) for w in workers]})
                start_response("200 OK", [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
                return [body]
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"qbridge serves /, /status.json, /metrics, /healthz and /readyz\n"]

        try:
            self.server: WSGIServer = make_server(host, port, app, server_class=_ThreadingServer, handler_class=_Quiet)
        except OSError as e:
            raise UsageError(f"--listen {listen}: {e.strerror}") from None
        self.thread = threading.Thread(target=self.server.serve_forever, name="qbridge-metrics", daemon=True)

    def _job_json(self, w: WorkerView) -> dict[str, Any]:
        """`status --json`'s job, with the state as this process knows it (state_of). Books that
        cannot be read (a database down, StaleBooks) make the job's entry say why under `error`,
        beside what this process knows; the other jobs are shown as ever (before, a 500 and a
        traceback in the run's log, at every request)."""
        try:
            books = self.books(w)
        except Exception as e:  # noqa: BLE001 - one job's books must not hide the others'
            state, why = state_of(w, None)
            return {"job": w.name, "state": state, "state_reason": why, "error": str(getattr(e, "orig", None) or e).splitlines()[0]}
        state, why = state_of(w, books)
        return {**books, "state": state, "state_reason": why}

    def _on_batch(self, job: str, stats: Any) -> None:
        self.batch.labels(job).observe(stats.seconds)
        self.history.batch(job, stats)

    def _token_query(self, environ: dict[str, Any]) -> str:
        """`?token=...` where the request carried the token so (a browser's), for the page's own links and forms."""
        given = (parse_qs(environ.get("QUERY_STRING", "")).get("token") or [""])[0]
        return f"?{urlencode({'token': given})}" if self.token and given else ""

    def _authorized(self, environ: dict[str, Any]) -> bool:
        if not self.token:
            return True
        given = environ.get("HTTP_AUTHORIZATION", "").removeprefix("Bearer ")
        if not given:
            given = (parse_qs(environ.get("QUERY_STRING", "")).get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.token.encode())

    def start(self) -> None:
        self.thread.start()
        log.info("status page on http://%s:%d/ and metrics on /metrics", *self.server.server_address[:2])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

