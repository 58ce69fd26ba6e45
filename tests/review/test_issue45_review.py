"""A fresh-eyes review of issue 45's changes (refused rows, state tables looked for again, dry
runs, the steered replay): interleavings and crash points that lost a message or stalled a
queue, each failing before its fix, and the interleavings checked and found sound, pinned
(`test_pinned_...`)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from nsb_endpoint import Endpoint

from bridge.commands.main import main as cli_main
from bridge.config import load_config
from bridge.demo.samples import openjms_destination, openjms_store
from bridge.pipeline.loop import JobRunner
from bridge.targets.base import Skipped

pytestmark = pytest.mark.postgres


# -- 4. the page's replay thread shares the `qbridge run` worker's JobRunner ----------------------
REVERSE_JMS = """
[routes]
"replies" = "replies"
"PriceFeed" = "prices.eu"
[types]
"Orders.OrderAccepted" = "Orders.Messages.OrderAccepted, Orders.Messages"
"prices.eu" = "Prices.PriceChanged, Prices"
"""


def _waiting_on(engine: sa.Engine, schema: str, table: str, seconds: float = 30) -> None:
    """Until a session waits for a lock on `schema`.`table`."""
    deadline = time.monotonic() + seconds
    sql = sa.text("select count(*) from pg_locks l join pg_class c on c.oid = l.relation "
                  "join pg_namespace n on n.oid = c.relnamespace where not l.granted and c.relname = :t and n.nspname = :s")
    while True:
        with engine.connect() as conn:
            if conn.execute(sql, {"t": table, "s": schema}).scalar_one():
                return
        assert time.monotonic() < deadline, f"nothing ever waited on {schema}.{table}"
        time.sleep(0.05)


def _quarantined_publish(tmp_path: Path, pg_server: str, legacy: str, nsb: str) -> tuple[sa.Engine, Path]:
    """A reverse job NServiceBus -> OpenJMS (both on PostgreSQL) whose publish to the topic
    prices.eu was quarantined (the topic did not exist yet); then the topic is made, with two
    durable subscribers: a replay now delivers the message to both."""
    engine = sa.create_engine(pg_server)
    with engine.begin() as conn:
        conn.execute(sa.text(f'SET search_path TO "{legacy}"'))
        t = openjms_store(conn)
        openjms_destination(conn, t, "replies", 2, True)
    (tmp_path / "reverse.toml").write_text(REVERSE_JMS)
    config = tmp_path / "bridge.toml"
    config.write_text(f"""
[connections]
jms = "{pg_server}"
nsb = "{pg_server}"

[[jobs]]
name   = "to-jms"
source = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{nsb}", queues = ["replies", "PriceFeed"] }}
target = {{ system = "openjms", connection = "jms", database = "jms", schema = "{legacy}" }}
mapping = "reverse.toml"
""")
    assert cli_main(["init", "-c", str(config)]) == 0
    ep = Endpoint(engine, nsb, "Prices")
    ep.send(ep.address("PriceFeed"), ep.headers("Prices.PriceChanged, Prices", "Publish"), b'{"Sku":"X-1"}')
    assert cli_main(["sync", "-c", str(config), "--once"]) == 0  # prices.eu does not exist yet: quarantined
    with engine.begin() as conn:
        conn.execute(sa.text(f'SET search_path TO "{legacy}"'))
        openjms_destination(conn, t, "prices.eu", 3, False, {"billing-sub": 301, "archive-sub": 302})
    return engine, config


def _topic_handles(engine: sa.Engine, legacy: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(f'select count(*) from "{legacy}".message_handles where destinationid = 3')).scalar_one()


def test_a_message_mapped_beside_a_pass_reading_the_store_never_sees_a_topic_without_its_subscribers(
        tmp_path: Path, pg_server: str, pg_schema: str, pg_schema2: str) -> None:
    """OpenJMSTarget.begin_batch (run by every pass, and by a replay before it maps) emptied
    `self.consumers` and then filled it from the store: a message mapped on the same target by
    another thread meanwhile (the status page's replay ran on the worker's own runner) saw a
    topic with no durable subscriber and was Skipped: lost. The pass's read is now assigned
    whole, and the page's replay has a runner of its own. Here a pass is held inside
    begin_batch (the consumers table locked) while a message is mapped on the same target."""
    legacy = pg_schema
    engine, config = _quarantined_publish(tmp_path, pg_server, pg_schema, pg_schema2)

    cfg = load_config(config)
    runner = JobRunner(cfg, cfg.jobs[0])
    with engine.connect() as conn:  # an earlier batch read the store as it is now
        runner.target.begin_batch(conn)
        [q] = runner.state.quarantined(conn, "to-jms")
    source = runner.sources[q["queue"]]
    row = source.from_raw(q["raw"], q["source_key"])
    lock = engine.connect()
    tx = lock.begin()
    lock.execute(sa.text(f'LOCK TABLE "{legacy}".consumers IN ACCESS EXCLUSIVE MODE'))  # the store answers slowly
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            runner.run_pass("replies")
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    w = threading.Thread(target=worker)
    w.start()
    try:
        _waiting_on(engine, legacy, "consumers")  # the worker's begin_batch: destinations read, consumers not yet
        _, result, reason = runner.map_row(source, row)
    finally:
        tx.rollback()
        lock.close()
        w.join(60)
    engine.dispose()
    assert not errors
    assert result is not None and not isinstance(result, Skipped), (result, reason)


def test_a_quarantine_replay_of_a_reverse_openjms_message_maps_against_the_store(
        tmp_path: Path, pg_server: str, pg_schema: str, pg_schema2: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`qbridge quarantine replay` maps the message (QuarantineDesk._replay_one -> map_row ->
    OpenJMSTarget.envelope) before _deliver calls target.begin_batch, so it maps against the
    destinations and durable subscribers of the runner's last batch: in a fresh process none at
    all ("destination does not exist", for every message, for ever), in `qbridge run` whatever the
    worker's last pass read (a subscriber made since is left out, one removed since gets a handle)."""
    engine, config = _quarantined_publish(tmp_path, pg_server, pg_schema, pg_schema2)
    capsys.readouterr()
    code = cli_main(["quarantine", "replay", "-c", str(config), "--all", "--json"])
    out = capsys.readouterr().out
    handles = _topic_handles(engine, pg_schema)
    engine.dispose()
    assert (code, handles) == (0, 2), out


# -- 2. JobSetup.kept(): a missing state table is trusted missing for KEPT_RECHECK_SECONDS ----------
LATER = ("qbridge_steering", "qbridge_steering_audit", "qbridge_givebacks", "qbridge_inflight")


def test_a_give_back_owed_within_seconds_of_a_miss_is_never_read_as_processed(make, tmp_path: Path) -> None:
    """A long-running process that looked for qbridge_givebacks and missed it goes on trusting the
    miss for KEPT_RECHECK_SECONDS (10 s). `init`, then a move-mode rollback cut off between its
    withdrawal and its give-back, inside those seconds: the process's next pass skips the
    `anything_owed` check, reads the withdrawn NGinn rows below the lowered checkpoint while they
    are still 'X', and records them as skipped (processed). Given back afterwards, they sit behind
    the checkpoint: lost. (The process's lock changing hands in between is what lets the rollback
    run; the runner here, as in tests/ledger/test_books_made_while_running.py, holds none.)"""
    from helpers import kill_at

    from bridge.pipeline.job import KEPT_RECHECK_SECONDS
    from bridge.retry import with_backoff

    b = make(batch_size=50, mode="move")
    with b.target.begin() as conn:  # books of before issue 28
        for name in LATER:
            conn.execute(sa.text(f'DROP TABLE "{b.target_schema}"."{name}"'))
    runner = b.runner()  # the default re-check interval
    b.insert(b.ready(5))
    assert runner.drain("MQueue1").delivered == 5  # its passes looked for qbridge_givebacks: missing
    missed = time.monotonic()
    assert b.cli("init") == 0
    kill_at(b, "rollback_after_commit:1", tmp_path, ("rollback", "--yes", "--job", "job1"))  # withdrawn, not given back
    assert b.count("Orders") == 0 and set(b.subqueues().values()) == {"X"}
    if time.monotonic() - missed >= KEPT_RECHECK_SECONDS:
        pytest.skip("this machine took longer than the re-check interval to run init and the rollback")
    stats = with_backoff(lambda: runner.drain("MQueue1"), "drain", sleep=lambda s: None)
    with_backoff(lambda: runner.drain("MQueue1"), "drain", sleep=lambda s: None)  # and once the table is seen
    assert (stats.delivered, stats.skipped) == (5, 0), stats
    assert b.count("Orders") == 5


def test_a_pass_on_sqlite_books_without_givebacks_does_not_wait_on_itself(tmp_path: Path) -> None:
    """A process on books older than qbridge_givebacks (a SQLite target): `_pass` asks
    givebacks_kept() inside its own target transaction (BEGIN IMMEDIATE). Before issue 45.3 the
    answer was cached by the first pass's give-back check, outside any transaction; now a miss
    is looked for again once KEPT_RECHECK_SECONDS have passed, and the look opens a second
    connection whose BEGIN IMMEDIATE waits for the pass's own write lock: 30 s, then "database
    is locked", on every pass from then on (the retry's look falls inside the transaction too).
    The job stalls."""
    from helpers import Bridge

    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/legacy.db", f"sqlite:///{tmp_path}/nsb.db")
    assert b.cli("init") == 0
    with b.target.begin() as conn:
        for name in LATER:
            conn.execute(sa.text(f'DROP TABLE "{name}"'))
    runner = b.runner()
    runner.kept_recheck_seconds = 0.5  # 10 s in a real process
    b.insert(b.ready(3))
    assert runner.drain("MQueue1").delivered == 3
    time.sleep(0.6)
    b.insert(b.ready(4, start=10))
    began = time.monotonic()
    try:
        delivered = runner.drain("MQueue1").delivered
    except sa.exc.OperationalError as e:
        pytest.fail(f"the pass failed after {time.monotonic() - began:.0f}s: {e.orig!s}")
    finally:
        b.dispose()
    assert delivered == 4


# -- 1. a refused row is quarantined: where the ledger lives in the legacy database ---------------
REVERSE_NGINN = """
[routes]
"Sender" = "Sender"
[headers.rename]
"Tenant" = "X-Tenant"
[types]
"Orders.OrderAccepted, Orders" = "Orders.Messages.OrderAccepted, Orders.Messages"
"""


def utf8mb3(mariadb_url: str) -> None:
    """The MariaDB database of `mariadb_url` made utf8mb3, as many legacy MariaDB/MySQL ones are."""
    engine = sa.create_engine(mariadb_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"ALTER DATABASE `{sa.engine.make_url(mariadb_url).database}` "
                             "CHARACTER SET utf8mb3 COLLATE utf8mb3_general_ci"))
    engine.dispose()


def reverse_nginn_job(tmp_path: Path, pg_server: str, pg_schema: str, legacy_url: str, queues: list[str]) -> Path:
    """A reverse job from the NServiceBus proxy `queues` in `pg_schema` into NGinn's "Sender" on
    `legacy_url`, whose database then holds qbridge's books; `init` run. Its config's path."""
    from bridge.demo.samples import create_nginn_queue

    legacy = sa.create_engine(legacy_url)
    create_nginn_queue(legacy, "Sender")
    legacy.dispose()
    (tmp_path / "reverse.toml").write_text(REVERSE_NGINN)
    config = tmp_path / "c.toml"
    config.write_text(f"""
[connections]
nsb    = "{pg_server}"
legacy = "{legacy_url}"
[[jobs]]
name   = "to-legacy"
source = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{pg_schema}", queues = {json.dumps(queues)} }}
target = {{ system = "nginn", connection = "legacy", timezone = "Europe/Warsaw", alias = "db" }}
mapping = "reverse.toml"
""")
    assert cli_main(["init", "-c", str(config)]) == 0
    return config


@pytest.mark.mariadb
def test_a_value_a_utf8mb3_legacy_database_refuses_costs_its_row_not_the_batch(
        tmp_path: Path, pg_server: str, pg_schema: str, mariadb_database: str) -> None:
    """NServiceBus -> NGinn on MariaDB whose database (so NGinn's tables and, made by `init`
    beside them, qbridge's ledger and quarantine) is utf8mb3, as many legacy MariaDB/MySQL
    databases are. A header holding U+1F600 is refused by msg_headers (1366, a DataError): the
    write is split and the row refused alone, as issue 45 wants. But its quarantine row keeps the
    raw row (and its parsed headers) as JSON with the emoji as it is, written by
    State.record outside any savepoint: refused again, the batch rolls back, and the next
    pass reads the same head of the proxy queue. The queue is stalled for good."""
    utf8mb3(mariadb_database)
    config = reverse_nginn_job(tmp_path, pg_server, pg_schema, mariadb_database, ["Sender"])
    legacy = sa.create_engine(mariadb_database)
    nsb = sa.create_engine(pg_server)
    ep = Endpoint(nsb, pg_schema, "Orders")
    for tenant in ("acme", "acme \U0001f600", "acme"):
        ep.send(ep.address("Sender"), ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send", Tenant=tenant), b"{}")
    code = cli_main(["sync", "-c", str(config), "--once"])
    with legacy.connect() as conn:
        delivered = conn.execute(sa.text("select count(*) from Sender")).scalar_one()
        kept = conn.execute(sa.text("select count(*) from qbridge_quarantine")).scalar_one()
    with nsb.connect() as conn:
        left = conn.execute(sa.text(f'select count(*) from "{pg_schema}"."Sender"')).scalar_one()
    legacy.dispose()
    nsb.dispose()
    assert (code, delivered, kept, left) == (0, 2, 1, 0)


def test_a_message_id_the_legacy_ledger_cannot_store_costs_its_row_not_the_queue(
        tmp_path: Path, pg_server: str, pg_schema: str, pg_schema2: str) -> None:
    """NServiceBus -> NGinn on PostgreSQL: a reverse job's ledger key is the message's
    NServiceBus.MessageId, any text the sender chose; JSON carries a NUL (\\u0000), PostgreSQL's
    text does not. The pass's ledger lookup (and the record) of that key fails outside any
    savepoint, so the head of the proxy queue fails the batch on every pass: the clean messages
    behind it never arrive."""
    from bridge.demo.samples import create_nginn_queue

    legacy, nsb = pg_schema, pg_schema2
    engine = sa.create_engine(pg_server)
    create_nginn_queue(engine, "Sender", legacy)
    (tmp_path / "reverse.toml").write_text(REVERSE_NGINN)
    config = tmp_path / "c.toml"
    config.write_text(f"""
[connections]
nsb    = "{pg_server}"
legacy = "{pg_server}"
[[jobs]]
name   = "to-legacy"
source = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{nsb}", queues = ["Sender"] }}
target = {{ system = "nginn", connection = "legacy", timezone = "Europe/Warsaw", schema = "{legacy}", alias = "db" }}
mapping = "reverse.toml"
""")
    assert cli_main(["init", "-c", str(config)]) == 0
    ep = Endpoint(engine, nsb, "Orders")
    for mid in ("ok-1", "bad\x00id", "ok-2"):
        ep.send(ep.address("Sender"), {**ep.headers("Orders.Messages.OrderAccepted, Orders.Messages", "Send"), "NServiceBus.MessageId": mid}, b"{}")
    code = cli_main(["sync", "-c", str(config), "--once"])
    with engine.connect() as conn:
        delivered = conn.execute(sa.text(f'select count(*) from "{legacy}"."Sender"')).scalar_one()
        left = conn.execute(sa.text(f'select count(*) from "{nsb}"."Sender"')).scalar_one()
    engine.dispose()
    assert (code, delivered, left) == (0, 2, 0)


# -- 1. pinned: interleavings of the refusal path checked and found sound -------------------------
def _narrow_headers(b) -> None:
    """The Orders table's headers column holds 2,000 characters (a DBA's varchar): a longer header
    text is a DataError, a value the column cannot store, refused row by row."""
    with b.target.begin() as conn:
        conn.execute(sa.text(f'ALTER TABLE "{b.target_schema}"."Orders" ALTER COLUMN headers TYPE varchar(2000)'))


def _poisoned(b, n: int, start: int, bad: set[int]) -> list[dict]:
    from bridge.demo.samples import nginn_row

    now = b.now_local()
    return [nginn_row("MQueue1", i, now, headers=f"Tenant={'p' * 3000 if i in bad else 'acme'}|_NG-Seq=1")
            for i in range(start, start + n)]


@pytest.mark.parametrize("columnar", [True, False])
def test_pinned_an_optimistic_spark_unit_redone_over_delivered_rows_with_a_refused_one_doubles_nothing(
        make, columnar: bool) -> None:
    """PASSES (sound): a unit's first attempt inserts without a ledger lookup. Over rows another
    attempt delivered, plus a refused row, the write is refused, redone in halves (writing the
    delivered rows again inside the transaction), then the ledger's key catches the repeat:
    LedgerConflict, the whole transaction rolls back, and the batch is redone with the lookup.
    Every message once, the refused one quarantined once, the counts add up."""
    b = make(batch_size=50)
    _narrow_headers(b)
    b.insert(_poisoned(b, 3, 1, set()))
    first = b.runner()
    first.columnar, first.lane_min_rows = columnar, 1
    assert first.run_range("MQueue1", 0, 3).stats.delivered == 3
    b.insert(_poisoned(b, 7, 4, {6}))
    again = b.runner()  # a duplicated unit over the whole range, first attempt: optimistic
    again.columnar, again.lane_min_rows = columnar, 1
    stats = again.run_range("MQueue1", 0, 10).stats
    assert (stats.delivered, stats.quarantined, stats.already) == (6, 1, 3), stats
    ids = b.message_ids("Orders")
    assert len(ids) == 9 and set(ids.values()) == {1}
    assert b.ledger() == {"delivered": 9, "quarantined": 1}


def test_pinned_a_move_pass_killed_between_its_commits_consumes_no_refused_row(make, tmp_path: Path) -> None:
    """PASSES (sound): move mode, a batch with a refused row, killed after the target commit and
    before the legacy one. The refused row is quarantined and stays 'I' (NGinn consumes no
    quarantined row); the pending keys the next pass consumes are the delivered rows' only."""
    from helpers import kill_at

    b = make(batch_size=50, mode="move")
    _narrow_headers(b)
    ids = b.insert(_poisoned(b, 5, 1, {3}))
    kill_at(b, "after_target_commit", tmp_path)
    assert set(b.subqueues().values()) == {"I"} and b.count("Orders") == 4
    assert b.cli("sync", "--once") == 0
    sub = b.subqueues()
    assert sub[ids[2]] == "I" and all(sub[i] == "X" for i in ids if i != ids[2])
    assert b.count("Orders") == 4 and b.ledger() == {"delivered": 4, "quarantined": 1}
    assert b.cli("verify") == 0


@pytest.mark.parametrize("columnar", [True, False])
def test_pinned_a_refused_row_on_a_sqlite_target_costs_its_row_alone(
        tmp_path: Path, pg_server: str, pg_schema: str, columnar: bool) -> None:
    """PASSES (sound): SQLite's savepoints inside the pass's BEGIN IMMEDIATE transaction, in
    move mode. OpenJMS messages on PostgreSQL, NServiceBus on SQLite; three carry a lone
    surrogate (refused by the encoder): each is quarantined and left in the store, the others
    delivered once and consumed, the counts add up."""
    from pipeline.test_refused_rows import MAPPING, Jms, jms_blob

    j = Jms(tmp_path, pg_server, f"sqlite:///{tmp_path}/nsb.db", source_schema=pg_schema, system="openjms",
            queues=["orders"], mapping=MAPPING, mode="move")
    j.setup()
    assert j.cli("init") == 0
    bad = {1, 40, 78}
    j.add([jms_blob("property" if i in bad else None) for i in range(80)])
    runner = j.runner()
    runner.columnar, runner.lane_min_rows = columnar, 1
    stats = runner.run_pass("orders")
    try:
        assert (stats.read, stats.delivered, stats.quarantined, stats.consumed) == (80, 77, 3, 77), stats
        with j.source.connect() as conn:
            left = conn.execute(sa.text(f'select count(*) from "{pg_schema}".messages')).scalar_one()
        assert left == 3
        got = j.message_ids("Orders")
        assert len(got) == 77 and set(got.values()) == {1}
        assert j.cli("verify") == 0
    finally:
        j.dispose()
