"""A replay delivers as a pass does, and is steered as one (issue 45, finding 4): a paused job's
messages are refused with who paused it and why (unless --even-if-paused), a replay keeps to
`max_rate` and holds at `max_target_depth`, saying that it waits. Before the fix a group replay of
a paused job with max_target_depth = 5 wrote all 20 messages into Orders and consumed 20 legacy
rows of the paused job."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import sqlalchemy as sa

from helpers import MAPPING, Bridge, endpoint_takes
from tests.service.test_metrics import _free_port
from tests.service.test_scheduler import Log, stop, wait_for

pytestmark = pytest.mark.postgres
UNROUTED = MAPPING.replace('"*"       = "Unrouted"\n', "")  # MQueue3 has no route: its messages are quarantined
FIXED = MAPPING.replace('"*"       = "Unrouted"\n', '"MQueue3" = "Orders"\n')


def quarantined_then_fixed(make, n: int = 20, **kw) -> Bridge:
    """`n` messages of MQueue3 quarantined (no route), then the mapping fixed: a replay delivers them to Orders."""
    b = make(queues=["MQueue1", "MQueue3"], mapping=UNROUTED, batch_size=50, **kw)
    b.insert(b.ready(n, queue="MQueue3"), queue="MQueue3")
    assert b.cli("sync", "--once") == 0
    assert b.ledger()["quarantined"] == n
    (b.tmp / "mapping.toml").write_text(FIXED)
    return b


def test_a_replay_of_a_paused_jobs_messages_is_refused_with_who_and_why(make, capsys: pytest.CaptureFixture[str]) -> None:
    b = quarantined_then_fixed(make, mode="move")
    assert b.cli("pause", "--job", "job1", "--why", "Orders endpoint redeploy", "--by", "dana") == 0
    capsys.readouterr()
    assert b.cli("quarantine", "replay", "--all") == 1
    said = capsys.readouterr().err
    assert "paused by dana" in said and "Orders endpoint redeploy" in said and "--even-if-paused" in said, said
    assert b.count("Orders") == 0 and b.ledger()["quarantined"] == 20
    assert set(b.subqueues("MQueue3").values()) == {"I"}  # nothing of the paused job consumed
    group = _group(b)
    assert b.cli("quarantine", "replay", "--group", group) == 1
    assert b.count("Orders") == 0
    assert b.cli("quarantine", "replay", "--all", "--even-if-paused") == 0
    assert b.count("Orders") == 20 and set(b.subqueues("MQueue3").values()) == {"X"}
    assert b.cli("verify") == 0


def _group(b: Bridge) -> str:
    with b.target.connect() as conn:
        return conn.execute(sa.text(f'select distinct grp from "{b.target_schema}".qbridge_quarantine')).scalar_one()


def test_a_replay_holds_at_max_target_depth_and_says_so(make) -> None:
    b = quarantined_then_fixed(make, extra="max_target_depth = 5\nresume_depth_percent = 40\n")
    proc = subprocess.Popen(b.spawn_args("quarantine", "replay", "--group", _group(b)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deepest = 0
    taken = 0
    deadline = time.monotonic() + 120
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the replay never ended"
        depth = b.count("Orders")
        deepest = max(deepest, depth)
        if depth >= 5:
            time.sleep(0.8)  # held at the limit for a while: the endpoint then takes what is there
            deepest = max(deepest, b.count("Orders"))
            taken += len(endpoint_takes(b, 5))
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    taken += b.count("Orders")
    assert deepest <= 5, f"Orders held {deepest} rows, its limit is 5"
    assert taken == 20 and b.ledger()["quarantined"] == 0
    assert re.search(r"waiting: job 'job1' held: Orders holds \d+ of 5", err), err
    assert b.cli("verify") == 0


def test_a_replay_keeps_to_max_rate(make) -> None:
    b = quarantined_then_fixed(make, extra='max_rate = "10/s"\n')
    started = time.monotonic()
    assert b.cli("quarantine", "replay", "--all") == 0
    took = time.monotonic() - started
    assert b.count("Orders") == 20
    assert took >= 1.8, f"20 messages at 10/s were replayed in {took:.2f} s"


@pytest.mark.slow
def test_the_pages_replay_button_of_a_paused_job_is_disabled_with_the_same_words(make) -> None:
    b = quarantined_then_fixed(make, schedule='every = "1s"')
    assert b.cli("pause", "--job", "job1", "--why", "Orders endpoint redeploy", "--by", "dana") == 0
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = b.spawn("run", "--listen", f"127.0.0.1:{port}")
    log = Log(proc)
    try:
        wait_for("the page", lambda: log.has("status page on"), proc=proc)
        html = urllib.request.urlopen(f"{base}/", timeout=10).read().decode()
        [row] = re.findall(r'<tr class="group".*?</tr>', html)
        assert "form method=\"post\" action=\"/actions/replay-group" not in row
        assert "disabled" in row and "paused by dana" in row and "Orders endpoint redeploy" in row, row
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)
        form = f"job=job1&group={_group(b)}&by=erin&csrf={csrf}".encode()
        request = urllib.request.Request(f"{base}/actions/replay-group", data=form, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 409
        assert "paused by dana" in refused.value.read().decode()
        time.sleep(1.5)
        assert b.count("Orders") == 0 and b.ledger()["quarantined"] == 20
    finally:
        stop(proc, log)
