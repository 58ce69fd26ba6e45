"""`migrate --even-if-paused` on a paused job, on Spark's side: the tasks run it too (a review
found them waiting for a resume the operator had overridden)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge.commands.steering import unpaused
from bridge.config import load_config
from bridge.pipeline import spark, units
from bridge.pipeline.spark import WorkUnit

from tests.systems.test_openjms_source import make_jms


def test_a_spark_unit_of_migrate_even_if_paused_runs_the_paused_job(request, tmp_path: Path, pg_server: str,
                                                                     pg_schema: str, monkeypatch) -> None:
    """`migrate --even-if-paused` lets the driver's runners through (`unpaused` sets
    `even_if_paused` on them), and every Spark task builds its own JobRunner in `run_unit`
    (`_RUNNERS`): the driver hands the overridden jobs to the tasks, or a task's first batch
    would wait (`_wait_to_go`) for a resume the operator, who asked to run anyway, will not give.
    The task is run here as Spark runs it, in-process, on a fresh worker (`_RUNNERS` empty)."""
    monkeypatch.setattr(units, "UNIT_POLL", 0.1)
    monkeypatch.setattr(spark, "_RUNNERS", {})
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, batch_size=10, queues=["orders"]):
        for i in range(25):
            j.queue_message(f"ID:p-{i}", accepted=1_141_916_400_000 + i)
        assert j.cli("pause", "--why", "cutover rehearsal") == 0
        config = load_config(j.config)
        driver = unpaused([j.runner()], True, 1)  # what cmd_migrate does with --even-if-paused
        assert [r.even_if_paused for r in driver] == [True] and driver[0].may_go() is None
        unit = WorkUnit(index=0, job="job1", queue="orders", rows=25, sliced=True)
        box: dict = {}
        overridden = frozenset(r.job.name for r in driver if r.even_if_paused)  # as spark._run hands them on
        task = threading.Thread(target=lambda: box.setdefault("result", spark.run_unit(config, unit, None, overridden)),
                                daemon=True)
        task.start()
        task.join(10)
        hung = task.is_alive()
        if hung:  # release the task so that no thread is left behind, then report
            assert j.cli("resume") == 0
            task.join(30)
        assert not hung, ("a Spark unit of `migrate --even-if-paused` waited on the pause the operator overrode "
                          "(delivered nothing in 10 s); only a `qbridge resume` let it go on")
        assert j.count("Orders") == 25


@pytest.mark.slow
def test_migrate_even_if_paused_finishes_on_spark(request, tmp_path: Path, pg_server: str, pg_schema: str) -> None:
    """The same through the command line on Spark `local[1]`: the command hangs (every task waits
    in `Units._wait_to_go`) until someone resumes the job; with `--even-if-paused` it should move
    the 25 handles and exit 0 while the job stays paused."""
    for j in make_jms("postgres", request, tmp_path, pg_server, pg_schema, batch_size=10, queues=["orders"]):
        for i in range(25):
            j.queue_message(f"ID:s-{i}", accepted=1_141_916_400_000 + i)
        assert j.cli("pause", "--why", "cutover rehearsal") == 0
        proc = subprocess.Popen([sys.executable, "-m", "bridge", "--log-level", "INFO", "migrate", "-c", str(j.config),
                                 "--master", "local[1]", "--even-if-paused"], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:  # unpaused, the same migrate takes about 3 s here
            proc.wait(60)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
        resumed_ok, before_resume = None, j.count("Orders")
        if hung:  # let it finish rather than kill it: the resume is what it waits for
            assert j.cli("resume") == 0
            try:
                proc.wait(120)
                resumed_ok = proc.returncode == 0 and j.count("Orders") == 25
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(5)
        assert not hung, (f"`migrate --even-if-paused` delivered {before_resume} of 25 "
                          f"in 60 s and only ended after `qbridge resume` (then finished cleanly: {resumed_ok})")
        assert proc.returncode == 0, "".join(lines[-30:])
        assert j.count("Orders") == 25
