"""What the status page can do (issue 38): pause and resume a job, replay and discard a failure
group, each a POST from a form on the page, audited with who did it.

Who may act: whoever may read the page (behind QBRIDGE_TOKEN where one is set; a listener on
loopback without a token is open to this host's users, as its page is). Safe against cross-
site requests: a form's POST carries a token the page alone knows (an HMAC of the process's own
random secret; another site cannot read the page to learn it, the same-origin policy stops
that), and a request whose Origin or Sec-Fetch-Site says another site sent it is refused.

A group's replay or discard runs on a thread of its own, one at a time per group, and the page
shows how far it got; what it has done stays done if the process stops (the quarantine's own
replay, bridge.lifecycle.quarantine). At most OPERATIONS_KEPT finished ones are remembered.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bridge.service.view import WorkerView

log = logging.getLogger("qbridge.page")
OPERATIONS_KEPT = 20
MAX_FORM = 16_384  # bytes of a form's body


@dataclass
class Operation:
    """A group's replay or discard started from the page."""

    job: str
    group: str
    action: str  # replay | discard
    actor: str
    total: int
    done: int = 0
    failed: int = 0
    finished: bool = False
    error: str | None = None
    waiting: str | None = None  # why it waits now: back-pressure holds the job
    thread: threading.Thread | None = field(default=None, repr=False)

    def line(self) -> str:
        state = ("failed: " + self.error if self.error else "done" if self.finished
                 else f"waiting: {self.waiting}" if self.waiting else "running")
        again = f", {self.failed:,} failed again" if self.failed else ""
        return f"{self.action} of group {self.group} ({self.job}) by {self.actor}: {self.done:,} of {self.total:,}{again}, {state}"


class PageActions:
    """The POST side of the status page."""

    def __init__(self, workers: Sequence[WorkerView]) -> None:
        self.workers = {w.name: w for w in workers}
        self.secret = secrets.token_bytes(32)
        self.operations: OrderedDict[tuple[str, str], Operation] = OrderedDict()
        self.lock = threading.Lock()

    def csrf(self) -> str:
        return hmac.new(self.secret, b"qbridge page actions", hashlib.sha256).hexdigest()

    # -- a request -----------------------------------------------------------------------------
    def handle(self, environ: dict[str, Any]) -> tuple[str, str]:
        """(HTTP status, text) of one POST to /actions/<what>; 303 means done, back to the page."""
        if not self._same_site(environ):
            return "403 Forbidden", "refused: the request came from another site"
        try:
            size = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            size = 0
        if size > MAX_FORM:
            return "413 Payload Too Large", "the form is too large"
        form = {k: v[0] for k, v in parse_qs(environ["wsgi.input"].read(size).decode(errors="replace")).items()}
        if not hmac.compare_digest(form.get("csrf", "").encode(), self.csrf().encode()):
            return "403 Forbidden", "refused: the form's token is missing or stale; reload the page and try again"
        what = environ.get("PATH_INFO", "").removeprefix("/actions/")
        worker = self.workers.get(form.get("job", ""))
        if worker is None:
            return "400 Bad Request", f"no job {form.get('job')!r} runs here"
        environ["qbridge.job"] = worker.name  # the job whose books the listener reads afresh after the action
        by = (form.get("by") or "").strip()[:60] or "someone"
        actor = f"{by} (status page, from {environ.get('REMOTE_ADDR', '?')})"
        why = (form.get("why") or "").strip()[:500] or None
        runner = worker.runner
        if what in ("pause", "resume"):
            if what == "pause" and not why:
                return "400 Bad Request", "say why the job is paused"
            runner.state.steering.set_paused(runner.target_engine, worker.name, what == "pause", actor, why)
            log.info("job=%s %sd by %s from the status page%s", worker.name, what, actor, f": {why}" if why else "")
            return "303 See Other", f"job {worker.name} {what}d"
        if what in ("replay-group", "discard-group"):
            group = form.get("group", "")
            if not group:
                return "400 Bad Request", "which group?"
            if what == "discard-group" and not why:
                return "400 Bad Request", "say why the group is discarded"
            if what == "replay-group":
                steering = runner.steering()
                if steering.paused:  # the button is disabled with these words; a stale page still posts
                    return "409 Conflict", steering.replay_refused()
            return self._start(worker, group, what.removesuffix("-group"), actor, why)
        return "404 Not Found", f"no action {what!r}"

    def _same_site(self, environ: dict[str, Any]) -> bool:
        if environ.get("HTTP_SEC_FETCH_SITE", "same-origin") not in ("same-origin", "none"):
            return False
        origin = environ.get("HTTP_ORIGIN")
        if origin and origin != "null":
            return urlsplit(origin).netloc == environ.get("HTTP_HOST", "")
        return origin != "null"

    # -- a group ---------------------------------------------------------------------------------
    def _start(self, worker: WorkerView, group: str, action: str, actor: str, why: str | None) -> tuple[str, str]:
        from bridge.ledger.state import QuarantineFilter

        where = QuarantineFilter(group=group)
        with worker.runner.target_engine.connect() as conn:
            total = sum(g["count"] for g in worker.runner.state.failure_groups(conn, worker.name, where))
        if not total:
            return "400 Bad Request", f"group {group} has nothing quarantined"
        key = (worker.name, group)
        with self.lock:
            running = self.operations.get(key)
            if running is not None and not running.finished:
                return "409 Conflict", f"group {group} is being worked on already: {running.line()}"
            op = Operation(worker.name, group, action, actor, total)
            self.operations[key] = op
            self.operations.move_to_end(key)
            while len(self.operations) > OPERATIONS_KEPT:
                oldest = next(iter(self.operations))
                if not self.operations[oldest].finished:
                    break
                self.operations.popitem(last=False)
        op.thread = threading.Thread(target=self._run, args=(worker, op, where, why), name=f"qbridge-{action}-{group}",
                                     daemon=True)
        op.thread.start()
        return "303 See Other", op.line()

    def _run(self, worker: WorkerView, op: Operation, where: Any, why: str | None) -> None:
        from bridge.lifecycle.quarantine import QuarantineDesk

        def each(outcome: Any) -> None:
            op.done += 1
            if outcome.action == "replay-failed":
                op.failed += 1

        from bridge.pipeline.loop import JobRunner

        try:
            # A runner of its own: its target's per-batch reads (an OpenJMS store's consumers) must not
            # change under the worker's pass beside it; the worker's rate and back-pressure it shares.
            runner = JobRunner(worker.runner.config, worker.runner.configured)
            runner.pace, runner.pressure = worker.runner.pace, worker.runner.pressure
            desk = QuarantineDesk(runner, op.actor, why)
            if op.action == "replay":
                desk.replay(None, where, on_each=each, keep=False, on_wait=lambda why: setattr(op, "waiting", why))
            else:
                desk.discard(None, where, on_each=each, keep=False)
        except Exception as e:  # noqa: BLE001 - said on the page and in the log; what was done stays done
            op.error = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
            log.warning("job=%s %s of group %s stopped: %s", op.job, op.action, op.group, op.error)
        try:  # audited however it ended: what a stopped one did stays done
            detail = f"group {op.group}: {op.done:,} messages, {op.failed:,} failed again"
            with worker.runner.target_engine.begin() as conn:
                worker.runner.state.steering.record(conn, worker.name, f"{op.action}ed group", op.actor, why,
                                                    detail + (f"; stopped: {op.error}" if op.error else ""))
        except Exception as e:  # noqa: BLE001 - each message's own audit row is written with it already
            log.warning("job=%s the audit row of the %s of group %s was not written: %s", op.job, op.action, op.group,
                        str(getattr(e, "orig", None) or e).strip().splitlines()[0])
        finally:
            op.finished = True

    def lines(self) -> list[str]:
        with self.lock:
            return [op.line() for op in reversed(self.operations.values())]
