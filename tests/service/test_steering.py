"""Steering a job in flight (issue 38): pause and resume for every process that runs the job,
a rate cap held across batches, and back-pressure from a destination queue an endpoint drains
slowly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from bridge.pipeline.steer import Pace, rate_batch
from helpers import Bridge
from tests.service.test_scheduler import run, stop, wait_for


def qbridge(b: Bridge, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", *args, "-c", str(b.config)], cwd=b.tmp, capture_output=True,
                          text=True, timeout=300)


def status(b: Bridge) -> dict:
    r = qbridge(b, "status", "--json")
    assert r.returncode == 0, r.stderr
    [job] = json.loads(r.stdout)["jobs"]
    return job


# -- pause and resume ---------------------------------------------------------------------------
@pytest.mark.slow
def test_a_pause_holds_both_runs_sync_and_migrate_until_resumed(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, schedule='every = "1s"',
               batch_size=20)
    assert b.cli("init") == 0
    first, first_log = run(b)
    second, second_log = run(b)
    try:
        b.insert(b.ready(10))
        wait_for("the first rows", lambda: b.count("Orders") == 10, proc=first)
        wait_for("the standby", lambda: first_log.has("standing by") or second_log.has("standing by"))
        r = qbridge(b, "pause", "--why", "legacy team re-indexes MQueue1", "--by", "alice")
        assert r.returncode == 0 and "paused" in r.stdout, r.stderr
        active = first_log if second_log.has("standing by") else second_log
        wait_for("the pause to be seen", lambda: active.has("is paused by alice"))
        b.insert(b.ready(15, start=100))
        time.sleep(3)  # three ticks of both schedulers
        assert b.count("Orders") == 10, "a paused job moved messages"
        # sync and migrate skip it with a line saying who, when and why, and exit 0
        for cmd in (("sync", "--once"), ("migrate", "--master", "local[1]")):
            r = qbridge(b, *cmd)
            assert r.returncode == 0, r.stderr
            assert "is paused by alice" in r.stderr and "legacy team re-indexes MQueue1" in r.stderr
        assert b.count("Orders") == 10
        s = status(b)["steering"]
        assert s["paused"] and s["paused_by"] == "alice" and s["why"] == "legacy team re-indexes MQueue1"
        assert "paused" in qbridge(b, "status").stdout
        assert [line for line in active.lines if "is paused by alice" in line].__len__() == 1, "one line per pause, not per tick"
        # the active run was killed while paused: the standby takes over, and still honours the pause
        (first if active is first_log else second).kill()
        time.sleep(3)
        assert b.count("Orders") == 10
        r = qbridge(b, "resume", "--by", "bob")
        assert r.returncode == 0, r.stderr
        wait_for("the rows held back", lambda: b.count("Orders") == 25)
    finally:
        for proc, log in ((first, first_log), (second, second_log)):
            if proc.poll() is None:
                stop(proc, log)
    assert not status(b)["steering"]["paused"]
    with b.target.connect() as conn:
        audit = conn.execute(sa.text(f'select action, actor, why from "{pg_schema}".qbridge_steering_audit order by id')).all()
    assert [tuple(a) for a in audit] == [("paused", "alice", "legacy team re-indexes MQueue1"), ("resumed", "bob", None)]
    assert b.cli("verify") == 0
    b.dispose()


def test_sync_even_if_paused_runs_the_job(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    b.insert(b.ready(5))
    assert qbridge(b, "pause", "--why", "cutover rehearsal").returncode == 0
    r = qbridge(b, "sync", "--once")
    assert r.returncode == 0 and "skipped" in r.stderr and b.count("Orders") == 0
    r = qbridge(b, "sync", "--once", "--even-if-paused")
    assert r.returncode == 0 and "running it anyway" in r.stderr, r.stderr
    assert b.count("Orders") == 5
    b.dispose()


def test_pause_needs_a_reason_and_a_job_the_config_has(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    r = qbridge(b, "pause")
    assert r.returncode == 2 and "--why" in r.stderr
    r = qbridge(b, "pause", "--why", "x", "--job", "nope")
    assert r.returncode != 0 and "nope" in r.stderr
    b.dispose()


def test_pause_on_a_target_without_the_table_says_run_init(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    with b.target.begin() as conn:
        conn.execute(sa.text("drop table qbridge_steering"))
    r = qbridge(b, "pause", "--why", "x")
    assert r.returncode != 0 and "qbridge init" in r.stderr, r.stderr
    assert b.cli("init") == 0 and qbridge(b, "pause", "--why", "x").returncode == 0
    b.dispose()


# -- rate -----------------------------------------------------------------------------------------
def test_pace_waits_rather_than_overshoots_and_earns_no_credit_idle() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pace = Pace(100.0, clock=lambda: now[0], sleep=sleep)
    pace.wait()
    assert slept == []  # the first batch goes at once
    pace.spent(100)
    pace.wait()
    assert now[0] == pytest.approx(1.0)  # 100 messages at 100/s: the next batch a second later
    now[0] += 3600  # an idle hour
    pace.wait()
    pace.spent(100)
    start = now[0]
    pace.wait()
    assert now[0] - start == pytest.approx(1.0), "an idle hour must not let a burst through"
    assert rate_batch(1000, 200.0) == 200 and rate_batch(1000, 0.5) == 1 and rate_batch(50, 200.0) == 50


def test_max_rate_caps_a_sync_and_is_checked_in_the_config(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=1000,
               extra='max_rate = "40/s"\n')
    assert b.cli("init") == 0
    b.insert(b.ready(120))
    began = time.monotonic()
    assert b.cli("sync", "--once") == 0
    took = time.monotonic() - began
    assert b.count("Orders") == 120
    # 120 messages at 40/s: three batches of 40, the 2nd and 3rd a second after the one before
    assert took >= 2.0, f"120 messages at 40/s took {took:.2f}s"
    b.extra = 'max_rate = "fast"\n'
    b.write_config()
    r = qbridge(b, "sync", "--once")
    assert r.returncode == 2 and "'fast' is not a rate" in r.stderr, r.stderr
    b.dispose()


# -- back-pressure ----------------------------------------------------------------------------------
class SlowEndpoint:
    """An NServiceBus endpoint that takes `per_second` messages a second off its queue, as the
    transport's receive does (oldest first, one row per transaction), and records the deepest
    the queue got."""

    def __init__(self, b: Bridge, table: str, per_second: float) -> None:
        self.b, self.table, self.per_second = b, b._qualified(table), per_second
        self.stopping = threading.Event()
        self.taking = threading.Event()  # cleared: the endpoint is down, the queue only fills
        self.taking.set()
        self.deepest = 0
        self.taken = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            if not self.taking.wait(0.05):
                continue
            with self.b.target.begin() as conn:
                depth = conn.execute(sa.text(f"select count(*) from {self.table}")).scalar_one()
                self.deepest = max(self.deepest, depth)
                gone = conn.execute(sa.text(f"delete from {self.table} where seq = (select min(seq) from {self.table})")).rowcount
                self.taken += gone
            time.sleep(1 / self.per_second)

    def __enter__(self) -> SlowEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()


@pytest.mark.slow
def test_back_pressure_holds_the_job_while_the_endpoint_is_behind(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, schedule='every = "1s"',
               batch_size=10, extra="max_target_depth = 40\nresume_depth_percent = 50\n")
    assert b.cli("init") == 0
    b.insert(b.ready(200))
    proc, log = run(b, "--listen", "127.0.0.1:0")
    try:
        with SlowEndpoint(b, "Orders", per_second=40) as endpoint:
            endpoint.taking.clear()  # down at first: the hold lasts until it comes up, whatever the machine's pace
            wait_for("the hold", lambda: log.has("held: Orders holds"), proc=proc)
            s = status(b)["steering"]
            assert s["held"] and s["held"].startswith("Orders holds") and s["held_since"]
            endpoint.taking.set()
            wait_for("every message through the slow endpoint", lambda: endpoint.taken == 200, proc=proc, timeout=120)
        # the queue never held more than its limit: each pass's batch is cut to the room left
        assert endpoint.deepest <= 40, f"the queue reached {endpoint.deepest} rows"
        assert log.has("no longer held")
        wait_for("the hold's end written", lambda: status(b)["steering"]["held"] is None)
        assert status(b)["steering"]["held_seconds"] > 0
    finally:
        stop(proc, log)
    assert b.cli("verify") == 0
    b.dispose()


def _take(b: Bridge, n: int) -> None:
    """An endpoint takes the `n` oldest rows of Orders."""
    with b.target.begin() as conn:
        conn.execute(sa.text(f"delete from {b._qualified('Orders')} where seq in "
                             f"(select seq from {b._qualified('Orders')} order by seq limit {n})"))


def test_a_hold_outlives_its_process_until_the_low_water_mark(tmp_path: Path) -> None:
    """Each `sync --once` is a process of its own: the next one takes over the hold the last
    left, keeps it down to the low-water mark, and ends it in the books when it ends (also when
    the limit is gone from the config), its seconds counted."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=10,
               extra="max_target_depth = 40\nresume_depth_percent = 50\n")
    assert b.cli("init") == 0
    b.insert(b.ready(100))
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 40
    assert status(b)["steering"]["held"] == "Orders holds 40 of 40"
    _take(b, 10)  # 30 left: below the limit, above the low-water mark (20)
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 30, "a new process forgot the hold the last one left"
    assert status(b)["steering"]["held"] is not None
    _take(b, 15)  # 15 left: below the mark, the hold ends and the queue fills to its limit again
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 40
    time.sleep(1.1)  # the hold's seconds are counted from when it began, to a second
    b.extra = ""
    b.write_config()  # the limit is gone: the hold the books show ends with the next pass
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 75
    s = status(b)["steering"]
    assert s["held"] is None and s["held_since"] is None
    assert s["held_seconds"] >= 1.0, s
    b.dispose()


def test_a_process_that_ran_the_job_before_takes_over_a_hold_another_set_meanwhile(tmp_path: Path) -> None:
    """A `qbridge run` that ran the job, lost its lock to a standby that then held the job, and
    takes the job back (or any process that looked at the hold once before another set it): it
    keeps the hold the books show down to the low-water mark, as a fresh process does."""
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=10,
               extra="max_target_depth = 40\nresume_depth_percent = 50\n")
    assert b.cli("init") == 0
    first = b.runner()
    assert first.may_go() is None  # it ran the job: nothing held then
    b.insert(b.ready(100))
    assert b.cli("sync", "--once") == 0  # another process meanwhile: fills Orders to its limit, held
    assert status(b)["steering"]["held"] == "Orders holds 40 of 40"
    _take(b, 10)  # 30 left: below the limit, above the low-water mark (20)
    why = first.may_go()
    assert why is not None and "held" in why, "a process that had looked before ignored the hold the books show"
    assert status(b)["steering"]["held"] is not None, "it ended the hold in the books above the low-water mark"
    _take(b, 15)  # 15 left: below the mark, the hold ends
    assert first.may_go() is None
    assert status(b)["steering"]["held"] is None
    b.dispose()


def test_two_processes_ending_one_hold_count_its_seconds_once(pg_server: str, pg_schema: str) -> None:
    """Migrate's tasks (a process each) wait out one hold and see it end within the same poll:
    each writes the end, and its seconds are added once, not once per process."""
    from datetime import timedelta

    from bridge.db import engine_for
    from bridge.ledger.steering import SteeringBook
    from bridge.timefmt import naive_utc, utcnow

    engine = engine_for(pg_server)
    book = SteeringBook(pg_schema)
    book.table.create(engine)
    book.set_held(engine, "job1", "Orders holds 40 of 40")
    with engine.begin() as conn:  # held for 100 s
        conn.execute(sa.update(book.table).values(held_since=naive_utc(utcnow()) - timedelta(seconds=100)))
    other = threading.Thread(target=book.set_held, args=(engine, "job1", None))
    state = {"raced": False}

    @sa.event.listens_for(engine, "after_cursor_execute")
    def race(conn, cursor, statement, *args) -> None:
        # The other process ends the hold between this one's read of held_since and its write (or
        # waits for this one to commit, if the read keeps it from doing so).
        if "held_since" in statement and statement.lstrip().upper().startswith("SELECT") and not state["raced"] \
                and threading.current_thread() is not other:
            state["raced"] = True
            other.start()
            other.join(timeout=3)

    try:
        book.set_held(engine, "job1", None)
        other.join(timeout=30)
    finally:
        sa.event.remove(engine, "after_cursor_execute", race)
    assert state["raced"]
    with engine.connect() as conn:
        s = book.read(conn, ["job1"])["job1"]
    assert s.held is None and s.held_since is None
    assert 100 <= s.held_seconds < 150, f"{s.held_seconds:.0f} s counted for a hold of 100 s"


@pytest.mark.slow
def test_migrate_shares_max_rate_over_its_task_slots(pg_server: str, pg_schema: str, tmp_path: Path) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, batch_size=1000,
               extra='max_rate = "100/s"\n')
    assert b.cli("init") == 0
    b.insert(b.ready(400))
    r = subprocess.run([sys.executable, "-m", "bridge", "--log-level", "INFO", "migrate", "-c", str(b.config), "--master",
                        "local[2]", "--unit-rows", "100"], cwd=b.tmp, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert b.count("Orders") == 400
    [line] = [ln for ln in r.stderr.splitlines() if "Spark ran" in ln]
    seconds = float(line.split(" units in ")[1].rstrip("s"))
    # 4 units on 2 slots, each at 50/s in batches of 50: a unit takes a second at least, 2 rounds
    assert seconds >= 1.8, f"400 messages at 100/s went through Spark in {seconds}s"
    b.dispose()


# -- probes -----------------------------------------------------------------------------------------
def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError) as e:  # not listening yet
        return 0, str(e)


@pytest.mark.slow
def test_probes_say_alive_and_ready_for_the_holder_and_alive_only_for_the_standby(pg_server: str, pg_schema: str,
                                                                                tmp_path: Path, monkeypatch) -> None:
    from tests.service.test_metrics import _free_port, _scrape

    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, schedule='every = "1s"')
    assert b.cli("init") == 0
    ports = _free_port(), _free_port()
    monkeypatch.setenv("QBRIDGE_TOKEN", "s3cret")  # the probes need none; the rest still does
    first, first_log = run(b, "--listen", f"127.0.0.1:{ports[0]}")
    wait_for("the first to run", lambda: _get(f"http://127.0.0.1:{ports[0]}/readyz")[0] == 200, proc=first)
    second, second_log = run(b, "--listen", f"127.0.0.1:{ports[1]}")
    try:
        wait_for("the standby", lambda: second_log.has("standing by"), proc=second)
        assert _get(f"http://127.0.0.1:{ports[0]}/healthz") == (200, "ok\n")
        assert _get(f"http://127.0.0.1:{ports[1]}/healthz") == (200, "ok\n")
        code, why = _get(f"http://127.0.0.1:{ports[1]}/readyz")
        assert code == 503 and "not holding its lock" in why
        assert _get(f"http://127.0.0.1:{ports[0]}/metrics")[0] == 401  # the token still guards the rest
        assert qbridge(b, "pause", "--why", "probe check").returncode == 0
        wait_for("the pause", lambda: first_log.has("is paused by"))
        m = _scrape(f"http://127.0.0.1:{ports[0]}/metrics", token="s3cret")
        assert [s.value for s in m["qbridge_job_paused"]] == [1.0]
        assert [s.value for s in m["qbridge_job_held"]] == [0.0]
        assert _get(f"http://127.0.0.1:{ports[0]}/readyz")[0] == 200, "a paused job still runs its (empty) ticks"
        first.kill()
        first.wait()
        wait_for("the take-over", lambda: _get(f"http://127.0.0.1:{ports[1]}/readyz")[0] == 200, proc=second)
    finally:
        for proc, log in ((first, first_log), (second, second_log)):
            if proc.poll() is None:
                stop(proc, log)
    b.dispose()


# -- reload -----------------------------------------------------------------------------------------
def test_sighup_applies_a_valid_config_from_the_next_batch_and_refuses_a_broken_one(tmp_path: Path) -> None:
    from helpers import MAPPING

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "1s"')
    assert b.cli("init") == 0
    proc, log = run(b)
    try:
        b.insert(b.ready(3))
        wait_for("the first rows", lambda: b.count("Orders") == 3, proc=proc)
        # a broken mapping: refused with its located error, the running config stays in force
        (b.tmp / "mapping.toml").write_text(MAPPING + "\n[routes\n")
        r = qbridge(b, "reload")
        assert r.returncode == 2 and "mapping.toml" in r.stderr, r.stderr  # `reload` checks before it signals
        import os
        import signal as sig

        os.kill(proc.pid, sig.SIGHUP)  # as `kill -HUP` would, without the check
        wait_for("the refusal", lambda: log.has("reload refused, the running config stays in force"), proc=proc)
        assert any("mapping.toml" in line for line in log.lines if "reload refused" in line), str(log)
        b.insert(b.ready(2, start=10))
        wait_for("rows under the running config", lambda: b.count("Orders") == 5, proc=proc)
        # a valid change: MQueue1 now goes to Sales, from the next batch
        (b.tmp / "mapping.toml").write_text(MAPPING.replace('"MQueue1" = "Orders"', '"MQueue1" = "Sales"'))
        r = qbridge(b, "reload")
        assert r.returncode == 0 and f"pid {proc.pid}" in r.stdout, r.stdout + r.stderr
        wait_for("the reload", lambda: log.has("config reloaded"), proc=proc)
        b.insert(b.ready(4, start=20))
        wait_for("rows under the new mapping", lambda: b.count("Sales") == 4, proc=proc)
        assert b.count("Orders") == 5
    finally:
        assert stop(proc, log) == 0, str(log)
    assert b.cli("verify") == 0
    b.dispose()


def test_a_reload_applies_within_a_long_drain_and_reschedules(tmp_path: Path) -> None:
    """A throttled backlog is one long tick: a reload's rate applies from the next batch, not
    once the backlog is gone; a new schedule is the job's next trigger; and a drain under way
    keeps the process ready (each committed batch counts as progress)."""
    from tests.service.test_metrics import _free_port

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "1h"',
               batch_size=1000, extra='max_rate = "4/s"\n')
    assert b.cli("init") == 0
    b.insert(b.ready(200))  # 50 s at 4/s
    port = _free_port()
    proc, log = run(b, "--listen", f"127.0.0.1:{port}")
    try:
        wait_for("the drain under way", lambda: b.count("Orders") >= 8, proc=proc)
        code, why = _get(f"http://127.0.0.1:{port}/readyz")
        assert code == 200, f"not ready amid its first drain: {why}"
        b.extra = 'max_rate = "fast"\n'
        b.write_config()
        proc.send_signal(signal.SIGHUP)
        wait_for("the refusal", lambda: log.has("reload refused"), proc=proc)
        assert any("'fast' is not a rate" in line for line in log.lines if "reload refused" in line), str(log)
        b.schedule, b.extra = 'every = "2s"', 'max_rate = "500/s"\n'
        b.write_config()
        proc.send_signal(signal.SIGHUP)
        began = time.monotonic()
        wait_for("the backlog at the new rate", lambda: b.count("Orders") == 200, proc=proc, timeout=30)
        assert time.monotonic() - began < 15, "the reloaded rate waited for the old drain to end"
        assert log.has("rescheduled (every 2s)"), str(log)
        b.insert(b.ready(3, start=1000))  # under `every = "1h"` these would wait an hour
        wait_for("rows on the new schedule", lambda: b.count("Orders") == 203, proc=proc, timeout=20)
    finally:
        assert stop(proc, log) == 0, str(log)
    assert b.cli("verify") == 0
    b.dispose()


def test_two_reloads_before_the_next_batch_leave_the_job_on_the_last_schedule(tmp_path: Path) -> None:
    """The second reload is compared with the config waiting to be taken, not with the one the
    job still runs: 5s -> 60s -> 5s leaves the trigger at 5s."""
    from datetime import timedelta

    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    from bridge.service.scheduler import Scheduler, trigger_for

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", schedule='every = "5s"')
    assert b.cli("init") == 0
    config = load_config(b.config)
    s = Scheduler([JobRunner(config, config.jobs[0])])
    [w] = s.workers
    s.scheduler.add_job(w.tick, trigger_for(w.runner.job), id=w.name, name=w.name)
    s.scheduler.start(paused=True)  # no tick takes the reloaded config in between
    try:
        for every in ("60s", "5s"):
            b.schedule = f'every = "{every}"'
            b.write_config()
            assert s.reload(str(b.config), None)
        assert s.scheduler.get_job(w.name).trigger.interval == timedelta(seconds=5), "the job kept the first reload's schedule"
        assert w.allowance == 60.0
    finally:
        s.scheduler.shutdown(wait=False)
        b.dispose()


def test_a_reload_landing_while_the_tick_takes_the_last_one_is_not_lost(tmp_path: Path, monkeypatch) -> None:
    """Scheduler.reload sets `pending` from the main thread while the job's tick may be taking
    the one before: the newer one must wait for the next batch, not be cleared with the older."""
    from bridge.config import load_config
    from bridge.pipeline.loop import JobRunner
    from bridge.service.scheduler import JobWorker

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    config = load_config(b.config)
    worker = JobWorker(JobRunner(config, config.jobs[0]), threading.Event())
    older, newer = JobRunner(config, config.jobs[0]), JobRunner(config, config.jobs[0])
    take = JobWorker._take

    def racing(self: JobWorker, new: JobRunner) -> None:
        if new is older:  # the main thread's second reload, after the tick read `pending`
            self.pending = newer
        take(self, new)

    monkeypatch.setattr(JobWorker, "_take", racing)
    worker.pending = older
    try:
        worker.tick()
        assert worker.stopped_reason is None and worker.last_error is None, worker.last_error
        assert worker.runner is newer, "the later reload was dropped: the job runs the older config"
        assert worker.pending is None
    finally:
        worker.lock.release()
        b.dispose()


def test_reload_finds_a_run_by_every_spelling_of_its_config_flag() -> None:
    from bridge.commands.reload import _config_paths

    assert _config_paths(["qbridge", "run", "-c", "a.toml"]) == ["a.toml"]
    assert _config_paths(["python3", "-m", "bridge", "run", "--config", "b.toml"]) == ["b.toml"]
    assert _config_paths(["qbridge", "run", "--config=c.toml", "--listen", "127.0.0.1:9"]) == ["c.toml"]
    assert _config_paths(["qbridge", "run", "-cd.toml"]) == ["d.toml"]
    assert _config_paths(["qbridge", "run", "-c"]) == []


def test_a_depth_limit_per_destination_queue_and_a_misspelt_one_refused(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", queues=["MQueue1", "MQueue2"],
               batch_size=10, extra='max_target_depth = { Orders = 20, "*" = 1000 }\n')
    assert b.cli("init") == 0
    b.insert(b.ready(50, queue="MQueue2"), queue="MQueue2")
    b.insert(b.ready(50))
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 20, "Orders' own limit"
    assert status(b)["steering"]["held"] == "Orders holds 20 of 20"
    b.extra = 'max_target_depth = { Order = 20, "*" = 1000 }\n'
    b.write_config()
    r = qbridge(b, "sync", "--once")
    assert r.returncode == 2, r.stderr
    said = " ".join(r.stderr.split())  # rich folds long lines
    assert "jobs[0].max_target_depth: 'Order' is no queue the mapping routes to" in said and "Orders" in said, said
    b.dispose()


@pytest.mark.slow
def test_a_pause_lets_the_batch_in_flight_commit_and_stops_the_next(pg_server: str, pg_schema: str,
                                                                     tmp_path: Path) -> None:
    b = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, batch_size=10)
    assert b.cli("init") == 0
    b.insert(b.ready(30))
    marker, resume = tmp_path / "frozen", tmp_path / "resume"
    proc = b.spawn("sync", "--once", env={"QBRIDGE_FAULT_PAUSE": "before_target_commit", "QBRIDGE_FAULT_FILE": str(marker),
                                          "QBRIDGE_FAULT_RESUME_FILE": str(resume), "QBRIDGE_FAULT_PAUSE_SECONDS": "60"})
    wait_for("the first batch before its commit", marker.exists, proc=proc)
    r = qbridge(b, "pause", "--why", "re-indexing", "--by", "gina")
    assert r.returncode == 0, r.stderr
    resume.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert b.count("Orders") == 10, "the batch in flight commits, the next one does not start"
    assert "is paused by gina" in err.decode()
    assert qbridge(b, "resume").returncode == 0
    assert b.cli("sync", "--once") == 0
    assert b.count("Orders") == 30
    r = qbridge(b, "status", "--json", "--history")
    history = json.loads(r.stdout)["jobs"][0]["steering_history"]
    assert [(a["action"], a["actor"], a["why"]) for a in history][0] == ("resumed", history[0]["actor"], None)
    assert (history[1]["action"], history[1]["actor"], history[1]["why"]) == ("paused", "gina", "re-indexing")
    text = qbridge(b, "status", "--history", "1").stdout
    assert "steering history" in text and "resumed" in text and "re-indexing" not in text, text
    assert b.cli("verify") == 0
    b.dispose()


def test_readiness_needs_the_lock_and_recent_progress_of_every_job() -> None:
    from types import SimpleNamespace as Worker

    from bridge.service.metrics import not_ready

    def worker(name: str, held: bool = True, ago: float | None = 5.0, stopped: str | None = None) -> Worker:
        return Worker(name=name, stopped_reason=stopped, lock=Worker(held=held), allowance=60.0,
                      last_success=None if ago is None else time.time() - ago)

    assert not_ready([worker("a"), worker("b")]) is None
    assert "job b: not holding its lock" in not_ready([worker("a"), worker("b", held=False)])
    assert "job a: last successful run 90s ago (allowed 60s)" in not_ready([worker("a", ago=90.0)])
    assert "job a: last successful run never" in not_ready([worker("a", ago=None)])
    assert not_ready([worker("a"), worker("b", held=False, stopped="bad mapping")]) is None, "a stopped job is /metrics' news"


def test_reload_signals_runs_only() -> None:
    from bridge.commands.reload import _subcommand

    assert _subcommand(["/usr/bin/python3", "/usr/local/bin/qbridge", "run", "-c", "a.toml"]) == "run"
    assert _subcommand(["python3", "-m", "bridge", "--log-level", "INFO", "run", "-c", "a.toml"]) == "run"
    assert _subcommand(["qbridge", "--log-format=json", "run"]) == "run"
    assert _subcommand(["qbridge", "sync", "--job", "run", "-c", "a.toml"]) == "sync"
    assert _subcommand(["python3", "-c", "import bridge; run"]) is None
    assert _subcommand(["vim", "run", "bridge.toml"]) is None
