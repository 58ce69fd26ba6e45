"""Connections cut where a flaky network cuts them (issue 29), through tests/pgproxy.py: before a
COMMIT reaches PostgreSQL, after it committed but before the answer came back (in doubt),
mid-COPY and mid-result. Whatever is cut, every message arrives once and `verify` balances."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import Bridge
from tests.systems.test_reverse_nginn import two_way  # noqa: F401 - a fixture
from pgproxy import FaultProxy

pytestmark = pytest.mark.postgres


@pytest.fixture()
def proxy(pg_server: str):
    p = FaultProxy().start()
    yield p
    p.stop()


def test_the_proxy_cuts_before_and_after_the_server_commits(proxy: FaultProxy, pg_server: str, pg_schema: str) -> None:
    direct = sa.create_engine(pg_server)
    via = sa.create_engine(proxy.url(), poolclass=sa.pool.NullPool)
    with direct.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{pg_schema}".t (n int)'))
    for n, where in ((1, "cut_before_commit"), (2, "cut_after_commit")):
        setattr(proxy, where, 1.0)
        with pytest.raises(sa.exc.OperationalError):
            with via.begin() as conn:
                conn.execute(sa.text(f'INSERT INTO "{pg_schema}".t VALUES ({n})'))
        setattr(proxy, where, 0.0)
    with direct.connect() as conn:  # the first never reached the server; the second committed, in doubt
        assert conn.execute(sa.text(f'SELECT array_agg(n) FROM "{pg_schema}".t')).scalar_one() == [2]
    assert proxy.counts["cut before commit"] == 1 and proxy.counts["cut after commit"] == 1
    direct.dispose()
    via.dispose()


def _through(tmp_path: Path, proxy: FaultProxy, pg_server: str, pg_schema: str, n: int, **kw) -> tuple[Bridge, Path]:
    """A bridge seeded directly, and a config of the same job that reaches PostgreSQL through the proxy."""
    direct = Bridge(tmp_path, pg_server, pg_server, source_schema=pg_schema, target_schema=pg_schema, **kw)
    assert direct.cli("init") == 0
    direct.insert(direct.ready(n))
    via = tmp_path / "via.toml"
    via.write_text(direct.config.read_text().replace(f'"{pg_server}"', f'"{proxy.url()}"'))
    return direct, via


def qbridge(config: Path, *args: str) -> int:
    from bridge.commands.main import main

    return main([args[0], "-c", str(config), *args[1:]])


@pytest.mark.parametrize("mode", ["copy", "move"])
def test_sync_with_one_commit_in_ten_cut_before_or_in_doubt_delivers_each_message_once(
        tmp_path: Path, proxy: FaultProxy, pg_server: str, pg_schema: str, mode: str) -> None:
    direct, via = _through(tmp_path, proxy, pg_server, pg_schema, 800, batch_size=20, mode=mode)
    proxy.cut_before_commit = proxy.cut_after_commit = 0.05
    assert qbridge(via, "sync", "--once", "--retries", "8") == 0
    proxy.cut_before_commit = proxy.cut_after_commit = 0.0
    assert proxy.counts["cut before commit"] >= 3 and proxy.counts["cut after commit"] >= 3, proxy.counts
    ids = direct.message_ids("Orders")
    assert len(ids) == 800 and set(Counter(ids).values()) == {1}
    if mode == "move":
        assert set(direct.subqueues().values()) == {"X"}
    assert direct.cli("verify") == 0


def test_a_copy_cut_midway_and_a_result_cut_midway_are_retried(tmp_path: Path, proxy: FaultProxy, pg_server: str,
                                                                pg_schema: str) -> None:
    direct, via = _through(tmp_path, proxy, pg_server, pg_schema, 300, batch_size=100)
    proxy.cut_copy_after = 2  # the third CopyData message: a batch's COPY of queue rows
    proxy.cut_rows_after = 250  # a read of the source, some batches later
    assert qbridge(via, "sync", "--once") == 0
    assert proxy.counts["cut mid-copy"] == 1 and proxy.counts["cut mid-result"] == 1, proxy.counts
    ids = direct.message_ids("Orders")
    assert len(ids) == 300 and set(Counter(ids).values()) == {1}
    assert direct.cli("verify") == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["copy", "move"])
def test_migrate_on_spark_with_commits_cut_delivers_each_message_once(tmp_path: Path, proxy: FaultProxy, pg_server: str,
                                                                      pg_schema: str, mode: str) -> None:
    """The Spark units and the closing pass, every connection through the proxy (the workers'
    too), one COMMIT in ten cut: units retry their batch, the ledger keeps each message once."""
    direct, via = _through(tmp_path, proxy, pg_server, pg_schema, 1200, batch_size=50, mode=mode)
    proxy.cut_before_commit = proxy.cut_after_commit = 0.05
    assert qbridge(via, "migrate", "--master", "local[2]", "--unit-rows", "300") == 0
    proxy.cut_before_commit = proxy.cut_after_commit = 0.0
    assert proxy.counts["cut before commit"] + proxy.counts["cut after commit"] >= 2, proxy.counts
    ids = direct.message_ids("Orders")
    assert len(ids) == 1200 and set(Counter(ids).values()) == {1}
    if mode == "move":  # a source commit cut before the server leaves its keys for the next pass
        assert qbridge(via, "sync", "--once") == 0 and set(direct.subqueues().values()) == {"X"}
    assert direct.cli("verify") == 0


def test_a_reverse_job_with_commits_cut_on_both_sides_delivers_each_message_once(two_way, proxy: FaultProxy,
                                                                                 pg_server: str) -> None:
    """NServiceBus -> NGinn, move mode: the proxy queue's delete and the NGinn insert commit in
    two databases; cut before or in doubt on either side, each reply lands once in NGinn."""
    from nsb_endpoint import Endpoint

    tw = two_way()
    ep = Endpoint(tw.engine, tw.nsb_schema, "Orders")
    sent = []
    for n in range(120):
        headers = ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send")
        ep.send(ep.address("Sender"), headers, b'{"OrderId":%d}' % n)
        sent.append(headers["NServiceBus.MessageId"])
    tw.write_config(batch_size=10)
    tw.config.write_text(tw.config.read_text().replace(f'"{tw.url}"', f'"{proxy.url()}"'))
    proxy.cut_before_commit = proxy.cut_after_commit = 0.05
    assert tw.cli("sync", "--once", "--job", "to-legacy", "--retries", "8") == 0
    proxy.cut_before_commit = proxy.cut_after_commit = 0.0
    assert proxy.counts["cut before commit"] + proxy.counts["cut after commit"] >= 2, proxy.counts
    got = Counter(r["unique_id"] for r in tw.rows(tw.sender))
    assert got == Counter(sent)
    assert tw.nsb_count("Sender") == 0
    assert tw.cli("verify", "--job", "to-legacy") == 0


@pytest.mark.slow
def test_qbridge_run_in_move_mode_with_commits_cut_delivers_each_message_once(tmp_path: Path, proxy: FaultProxy,
                                                                           pg_server: str, pg_schema: str) -> None:
    """The scheduler: its passes, its lock and its pruning all through the proxy while new rows
    keep arriving; stopped with SIGTERM once everything is there."""
    import signal
    import subprocess
    import sys
    import time

    direct, via = _through(tmp_path, proxy, pg_server, pg_schema, 100, batch_size=20, mode="move", schedule='every = "1s"')
    proxy.cut_before_commit = proxy.cut_after_commit = 0.05
    run = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(via)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    try:
        direct.insert(direct.ready(100, start=1000))
        deadline = time.monotonic() + 90
        # Delivered, and consumed: a source commit cut before the server leaves its keys pending
        # in the checkpoint, for the next pass to consume.
        while direct.count("Orders") < 200 or set(direct.subqueues().values()) != {"X"}:
            assert run.poll() is None, run.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, f"{direct.count('Orders')} of 200 delivered"
            time.sleep(0.5)
    finally:
        proxy.cut_before_commit = proxy.cut_after_commit = 0.0
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) == 0
    assert proxy.counts["cut before commit"] + proxy.counts["cut after commit"] >= 1, proxy.counts
    ids = direct.message_ids("Orders")
    assert len(ids) == 200 and set(Counter(ids).values()) == {1}
    assert set(direct.subqueues().values()) == {"X"}
    assert direct.cli("verify") == 0
