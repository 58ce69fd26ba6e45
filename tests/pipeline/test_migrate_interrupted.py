"""`qbridge migrate` says it moves and stops when told (issue 46.4, 46.5), on a real local Spark
and PostgreSQL: without a terminal a progress line every 10 s, of units and rows, that moves;
Ctrl-C (SIGINT) cancels the Spark job, exits 130 within seconds with what moved and no trace;
and afterwards `verify`, `verify --deep` and `status` agree on what moved and what waits (verify
said `source rows 0, delivered 0, backlog 30000` with 18,000 delivered)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from helpers import Bridge
from tests.pipeline.test_spark_migrate import _java

pytestmark = pytest.mark.slow
ROWS = 30_000


def _json(b: Bridge, *args: str) -> dict:
    r = subprocess.run(b.spawn_args(*args), capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_ctrl_c_stops_a_migration_at_once_and_the_books_agree_after(make) -> None:
    _java()
    b: Bridge = make(batch_size=500, extra='max_rate = "1500/s"\n')  # 20 s of work: time for lines and a Ctrl-C
    now = b.now_local()
    from bridge.demo.samples import nginn_row

    with b.source.begin() as conn:
        conn.execute(b.tables["MQueue1"].insert(), [nginn_row("MQueue1", i, now) for i in range(ROWS)])
    proc = subprocess.Popen(b.spawn_args("migrate", "--unit-rows", "1000", "--master", "local[2]"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        assert proc.stderr is not None
        while time.monotonic() < deadline:  # the first progress line with a unit done
            line = proc.stderr.readline()
            assert line, f"migrate ended before its first progress line: {''.join(lines)}"
            lines.append(line)
            m = re.search(r"migrate: units done (\d+) of (\d+) .*; rows of the units done \(about\) ([\d,]+) of ([\d,]+)", line)
            if m and int(m.group(1)) > 0:
                assert int(m.group(2)) == ROWS // 1000 and m.group(4) == f"{ROWS:,}", line
                assert int(m.group(3).replace(",", "")) >= 1000, line
                break
        else:
            raise AssertionError("no progress line: " + "".join(lines))
        stopped = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(lines) + rest
    assert proc.returncode == 130, stderr
    assert took < 30, f"{took:.0f}s to stop"
    delivered = b.count("Orders")
    assert 0 < delivered < ROWS
    said = re.search(r"migrate interrupted: ([\d,]+) delivered", stderr)
    assert said and int(said.group(1).replace(",", "")) == delivered, stderr
    assert "Traceback" not in stderr and "Exception" not in stderr, stderr

    books = _json(b, "verify", "--json", "--deep")
    [q] = books["jobs"][0]["queues"]
    assert (q["source_rows"], q["delivered"], q["backlog"], q["missing"]) == (delivered, delivered, ROWS - delivered, 0), q
    assert q["deep"]["matched"] == delivered and q["deep"]["mismatched"] == 0, q["deep"]
    assert books["balanced"]
    [job] = _json(b, "status", "--json")["jobs"]
    assert (job["rows_moved"], job["backlog"]) == (delivered, ROWS - delivered), job
    # and a second migrate finishes the rest, once each
    b.extra = ""  # the rest at full speed: the rate gave the first run time to be interrupted
    b.write_config()
    r = subprocess.run(b.spawn_args("migrate", "--master", "local[2]"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert b.count("Orders") == ROWS and len(b.message_ids("Orders")) == ROWS
    [job] = _json(b, "status", "--json")["jobs"]
    assert (job["rows_moved"], job["backlog"]) == (ROWS, 0), job
