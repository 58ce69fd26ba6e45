"""Logs a machine can read (issue 39): `--log-format json` and QBRIDGE_LOG_FORMAT give one JSON
object a line, with the job and queue whose work wrote the line (a context, never the message's
words), trace and span ids when tracing, and secrets masked as in text lines; text stays the
default; Spark's task workers log in the driver's format."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import Bridge
from receivers import PostReceiver

from bridge.commands.main import main
from bridge.pipeline.logcontext import JsonFormatter, TextFormatter, about
from tests.commands.test_cli import _config

TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING|ERROR|DEBUG) ")
# Spark's JVM logs through log4j (spark_conf/log4j2.properties: errors only) in its own format:
# those lines, and a Java stack trace's lines under them, are the JVM's, not qbridge's.
JVM_LINE = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (FATAL|ERROR|WARN|INFO|DEBUG) |\s+at |Caused by: ")


def _lines(stderr: str) -> list[dict]:
    """The log lines, each one JSON object; no text-format log line among them (what else is on
    stderr is the command's own closing message or progress, for people)."""
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
        else:
            assert not TEXT_LINE.match(line), line
    return out


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without logging or tracing settings of its own, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "QBRIDGE_LOG", "QBRIDGE_FAULT"))}
    return {**env, **extra}


def _record(message: str, exc_info=None) -> dict:
    record = logging.LogRecord("qbridge.run", logging.ERROR, __file__, 1, message, (), exc_info)
    return json.loads(JsonFormatter().format(record))


def test_sync_logs_one_json_object_a_line_with_job_and_queue(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    b.insert(b.ready(10))
    r = subprocess.run([sys.executable, "-m", "bridge", "--log-format", "json", "sync", "--once", "-c", str(b.config)],
                       cwd=tmp_path, check=False, capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stderr)
    batches = [line for line in lines if "delivered=" in line["message"]]
    assert len(batches) == 3  # 4 + 4 + 2
    for line in batches:
        assert line["level"] == "INFO" and line["logger"] == "qbridge.batch"
        assert line["job"] == "job1" and line["queue"] == "MQueue1"
        assert line["time"].endswith("Z") and "T" in line["time"]
        assert "trace_id" not in line  # no tracing configured
    b.dispose()


def test_text_is_the_default(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    b.insert(b.ready(5))
    r = subprocess.run(b.spawn_args("sync", "--once"), cwd=tmp_path, check=False, capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    batches = [line for line in r.stderr.splitlines() if "delivered=" in line]
    assert len(batches) == 2 and all(TEXT_LINE.match(line) for line in batches), r.stderr
    assert not any(line.startswith("{") for line in r.stderr.splitlines()), r.stderr
    b.dispose()


def test_the_environment_chooses_json_and_secrets_stay_masked(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "postgresql+psycopg://bridge:s3cret@127.0.0.1:1/nsb", "postgresql")
    from bridge.demo.samples import create_nginn_queue

    create_nginn_queue(sa.create_engine(f"sqlite:///{tmp_path}/l.db"), "MQueue1")
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "--once", "--retries", "2", "-c", str(cfg)], cwd=tmp_path,
                       check=False, capture_output=True, text=True, timeout=120, env=_env(QBRIDGE_LOG_FORMAT="json"))
    assert r.returncode == 1
    assert "s3cret" not in r.stderr
    retries = [line for line in _lines(r.stderr) if line["level"] == "WARNING"]
    # the job is the one whose tables were being checked (the context of its work), no queue yet
    assert retries and "bridge:***@127.0.0.1:1/nsb" in retries[0]["message"] and retries[0]["job"] == "j"
    assert "queue" not in retries[0]


def test_a_bad_format_is_refused_naming_it_and_the_choices(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("QBRIDGE_LOG_FORMAT", "xml")
    assert main(["status", "-c", str(tmp_path / "none.toml")]) == 2
    said = capsys.readouterr().err
    assert "config error" in said and "'xml'" in said and "QBRIDGE_LOG_FORMAT" in said and "text or json" in said
    with pytest.raises(SystemExit) as e:
        main(["--log-format", "xml", "status", "-c", str(tmp_path / "none.toml")])
    assert e.value.code == 2
    said = capsys.readouterr().err
    assert "--log-format" in said and "'xml'" in said and "'text', 'json'" in said


def test_job_and_queue_come_from_the_work_not_from_the_words() -> None:
    # the review's case: "job has" is no job; a line outside any job's work names none
    line = _record("every job has stopped on an error; exiting")
    assert "job" not in line and "queue" not in line
    assert _record("job=orders queue=Q1 unexpected")["message"] == "job=orders queue=Q1 unexpected"
    assert "job" not in _record("job=orders queue=Q1 unexpected")
    seen: dict[str, dict] = {}
    with about("orders", "Q1"):
        seen["inside"] = _record("lock taken over")
        with about("billing"):
            seen["nested"] = _record("x")
        seen["after"] = _record("y")
        # another thread (APScheduler's pool runs jobs on several) has its own context
        t = threading.Thread(target=lambda: seen.setdefault("thread", _record("z")))
        t.start()
        t.join()
    seen["outside"] = _record("w")
    assert (seen["inside"]["job"], seen["inside"]["queue"]) == ("orders", "Q1")
    assert seen["nested"]["job"] == "billing" and "queue" not in seen["nested"]
    assert (seen["after"]["job"], seen["after"]["queue"]) == ("orders", "Q1")
    assert "job" not in seen["thread"] and "job" not in seen["outside"]


def test_an_exception_is_kept_with_its_traceback_and_a_url_password_masked() -> None:
    try:
        raise ValueError("cannot connect to postgresql+psycopg://bridge:s3cret@db:5432/nsb")
    except ValueError:
        exc_info = sys.exc_info()
    with about("orders", "Q1"):
        line = _record("job=orders unexpected postgresql://bridge:s3cret@db/nsb", exc_info)
        text = TextFormatter().format(logging.LogRecord("qbridge.run", logging.ERROR, __file__, 1, "unexpected", (), exc_info))
    assert line["job"] == "orders" and line["queue"] == "Q1"
    assert "Traceback" in line["exception"] and "ValueError: cannot connect to" in line["exception"]
    assert "postgresql+psycopg://bridge:***@db:5432/nsb" in line["exception"]
    assert "s3cret" not in json.dumps(line) and "s3cret" not in text
    assert "bridge:***@db:5432/nsb" in text and TEXT_LINE.match(text)


def test_lines_logged_inside_a_batch_carry_its_trace_and_span_ids(tmp_path: Path) -> None:
    sink = PostReceiver()  # an OTLP/HTTP endpoint that takes every request
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    b.insert(b.ready(10))
    r = subprocess.run([sys.executable, "-m", "bridge", "--log-format", "json", "sync", "--once", "-c", str(b.config)],
                       cwd=tmp_path, check=False, capture_output=True, text=True, timeout=120,
                       env=_env(OTEL_EXPORTER_OTLP_ENDPOINT=sink.url))
    sink.stop()
    assert r.returncode == 0, r.stderr
    batches = [line for line in _lines(r.stderr) if "delivered=" in line["message"]]
    assert len(batches) == 3
    for line in batches:
        assert re.fullmatch(r"[0-9a-f]{32}", line["trace_id"]) and re.fullmatch(r"[0-9a-f]{16}", line["span_id"])
    assert len({line["trace_id"] for line in batches}) == 1  # one drain's trace
    assert len({line["span_id"] for line in batches}) == 3  # each batch's own span
    b.dispose()


def test_spark_tasks_log_json_lines_too(tmp_path: Path) -> None:
    """A task's warning (its first attempt fails, Spark retries it) in `migrate --log-format json`:
    the worker gets the format through the executors' environment, and the job and queue of its
    unit. Every stderr line is JSON but the JVM's own log4j lines."""
    if shutil.which("java") is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("Java is not installed; Spark needs it")
        pytest.skip("Java is not installed; Spark needs it")
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=20)
    assert b.cli("init") == 0
    b.insert(b.ready(100))
    r = subprocess.run([sys.executable, "-m", "bridge", "--log-format", "json", "migrate", "-c", str(b.config),
                        "--master", "local[2]", "--unit-rows", "50"], cwd=tmp_path, check=False, capture_output=True, text=True,
                       timeout=300, env=_env(QBRIDGE_FAULT_FAIL="after_target_commit"))
    assert r.returncode == 0, r.stderr
    others = [line for line in r.stderr.splitlines() if not line.startswith("{") and not JVM_LINE.match(line)]
    assert not others, r.stderr
    lines = _lines(r.stderr)
    failed = [line for line in lines if "attempt 1 failed" in line["message"]]
    assert len(failed) == 2, r.stderr  # one a unit, logged by the task's Python worker
    for line in failed:
        assert line["level"] == "WARNING" and line["logger"] == "qbridge.migrate"
        assert line["job"] == "job1" and line["queue"] == "MQueue1"
    assert any(line["message"].startswith("Spark UI: ") for line in lines)
    assert "job" not in next(line for line in lines if line["message"].startswith("planned "))
    b.dispose()
