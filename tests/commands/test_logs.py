"""Logs a machine can read (issue 39): `--log-format json` and QBRIDGE_LOG_FORMAT give one JSON
object a line, with the job and queue a line is about, and secrets masked as in text lines."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from bridge.commands.logs import JsonFormatter
from helpers import Bridge
from tests.commands.test_cli import _config


def _lines(stderr: str) -> list[dict]:
    """The log lines, each one JSON object; no text-format log line among them (what else is on
    stderr is the command's own closing message or progress, for people)."""
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
        else:
            assert not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING|ERROR|DEBUG) ", line), line
    return out


def test_sync_logs_one_json_object_a_line_with_job_and_queue(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    assert b.cli("init") == 0
    b.insert(b.ready(10))
    r = subprocess.run([sys.executable, "-m", "bridge", "--log-format", "json", "sync", "--once", "-c", str(b.config)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
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


def test_the_environment_chooses_json_and_secrets_stay_masked(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "postgresql+psycopg://bridge:s3cret@127.0.0.1:1/nsb", "postgresql")
    from bridge.demo.samples import create_nginn_queue

    create_nginn_queue(sa.create_engine(f"sqlite:///{tmp_path}/l.db"), "MQueue1")
    env = {**os.environ, "QBRIDGE_LOG_FORMAT": "json"}
    r = subprocess.run([sys.executable, "-m", "bridge", "sync", "--once", "--retries", "2", "-c", str(cfg)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1
    assert "s3cret" not in r.stderr
    retries = [line for line in _lines(r.stderr) if line["level"] == "WARNING"]
    assert retries and "bridge:***@127.0.0.1:1/nsb" in retries[0]["message"] and retries[0]["job"] == "j"


def test_an_exception_is_kept_with_its_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("qbridge.run", logging.ERROR, __file__, 1, "job=%s unexpected", ("orders",),
                                   sys.exc_info())
    line = json.loads(JsonFormatter().format(record))
    assert line["job"] == "orders" and line["message"] == "job=orders unexpected"
    assert "ValueError: boom" in line["exception"]
