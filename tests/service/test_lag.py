"""Lag is the age of the oldest message still waiting (issue 46.3), read from the source, so it
grows while a job stands still (paused, held, failing) and is 0 once nothing waits: NGinn's first
row after the checkpoint, OpenJMS's acceptedTime, BizTalk's Spool.dtTimeStamp, an NServiceBus
proxy queue's head row's TimeSent. Each read through `qbridge status --json`."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from bridge.commands.main import main as cli_main
from bridge.timefmt import to_wire
from helpers import TZ, Bridge
from nsb_endpoint import Endpoint
from tests.systems.test_biztalk_source import SMALL, fx, make_bt
from tests.systems.test_openjms_source import make_jms
from tests.systems.test_reverse_nginn import two_way  # noqa: F401 - the fixture

AGO = 90  # seconds: how old each test's waiting messages are


def status(config: Path, job: str | None = None) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["status", "-c", str(config), "--json", *(["--job", job] if job else [])]) == 0
    return next(j for j in json.loads(out.getvalue())["jobs"] if job is None or j["job"] == job)


def lag_of(config: Path, job: str | None = None) -> tuple[float | None, int | None]:
    s = status(config, job)
    return s["lag_seconds"], s["backlog"]


def grows_while_paused(b: Any, job: str = "job1") -> None:
    """Paused, the lag is the waiting messages' age, and it grows with the clock; once they are
    moved it is 0."""
    assert cli_main(["pause", "-c", str(b.config), "--job", job, "--why", "lag test"]) == 0
    assert cli_main(["sync", "-c", str(b.config), "--once", "--job", job]) == 0  # moves nothing: paused
    lag, backlog = lag_of(b.config, job)
    assert backlog and backlog > 0
    assert lag is not None and AGO - 5 <= lag <= AGO + 60, lag
    time.sleep(1.2)
    later, _ = lag_of(b.config, job)
    assert later is not None and later >= lag + 1, (lag, later)
    assert cli_main(["resume", "-c", str(b.config), "--job", job]) == 0
    assert cli_main(["sync", "-c", str(b.config), "--once", "--job", job]) == 0
    assert lag_of(b.config, job) == (0.0, 0)


def test_nginn_lag_is_the_first_waiting_rows_age_in_its_time_zone(tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db")
    assert b.cli("init") == 0
    assert lag_of(b.config) == (0.0, 0)  # nothing ever waited
    rows = b.ready(3)
    for i, r in enumerate(rows):  # the oldest first, as NGinn's ids go; insert_time is Europe/Warsaw wall time
        r["insert_time"] = b.now_local() - timedelta(seconds=AGO - i)
    b.insert(rows)
    grows_while_paused(b)
    # A new row after a drain: the lag is its age, not the last batch's
    fresh = b.ready(1, start=50)
    fresh[0]["insert_time"] = b.now_local() - timedelta(seconds=30)
    b.insert(fresh)
    lag, backlog = lag_of(b.config)
    assert backlog == 1 and lag is not None and 29 <= lag <= 90


@pytest.fixture()
def jms(request: pytest.FixtureRequest, tmp_path: Path, pg_server: str, pg_schema: str) -> Iterator[Any]:
    yield from make_jms("postgres", request, tmp_path, pg_server, pg_schema, queues=["orders"])


def test_openjms_lag_is_the_oldest_waiting_handles_accepted_time(jms: Any) -> None:
    now_ms = int(time.time() * 1000)
    jms.queue_message("ID:old", accepted=now_ms - AGO * 1000)
    jms.queue_message("ID:new", accepted=now_ms - 10_000)
    grows_while_paused(jms)


def test_biztalk_lag_is_the_oldest_waiting_entrys_spool_time(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for bt in make_bt("sqlite", request, tmp_path):
        local = datetime.now(ZoneInfo(TZ)).replace(tzinfo=None)
        bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL], when=local - timedelta(seconds=AGO))
        bt.publish(context=fx("ctx_receive.bin"), parts=[SMALL], when=local - timedelta(seconds=5))
        grows_while_paused(bt)


@pytest.mark.postgres
def test_reverse_lag_is_the_proxy_queue_heads_time_sent(two_way) -> None:
    tw = two_way()
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    sent = datetime.now(timezone.utc) - timedelta(seconds=AGO)
    for seconds in (0, 60):
        h = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send",
                       **{"NServiceBus.TimeSent": to_wire(sent + timedelta(seconds=seconds))})
        ep.send(ep.address("Sender"), h, b'{"OrderId":1}')
    grows_while_paused(tw, job="to-legacy")
