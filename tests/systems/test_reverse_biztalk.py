"""Reverse jobs, NServiceBus -> BizTalk: rows in a staging table that a WCF-SQL polling receive
location takes, exactly once; the polling statements and the table compiled for SQL Server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql
from sqlalchemy.schema import CreateTable

from bridge.commands.main import main as cli_main
from bridge.targets.biztalk import polling_statements, staging_table
from helpers import kill_at
from nsb_endpoint import Endpoint

MAPPING = """
[routes]
"Invoicing" = "InvoiceIn"
[types]
"http://example.org/billing#InvoiceRequested" = "Billing.Messages.InvoiceRequested, Billing.Messages"
"""


class ToBizTalk:
    def __init__(self, tmp: Path, pg: str, nsb: str, staging: str) -> None:
        self.pg, self.nsb_schema, self.staging_schema = pg, nsb, staging
        (tmp / "m.toml").write_text(MAPPING)
        self.config = tmp / "c.toml"
        self.config.write_text(f"""
[connections]
nsb = "{pg}"
bts = "{pg}"
[[jobs]]
name = "to-biztalk"
source = {{ system = "nservicebus", connection = "nsb", flavor = "postgresql", schema = "{nsb}", queues = ["Invoicing"] }}
target = {{ system = "biztalk", connection = "bts", schema = "{staging}" }}
mapping = "m.toml"
batch_size = 3
""")
        self.engine = sa.create_engine(pg)
        self.endpoint = Endpoint(self.engine, nsb, "Billing")
        self.table = staging_table("QBridgeToBizTalk", staging)

    def cli(self, *args: str) -> int:
        return cli_main([args[0], "-c", str(self.config), *args[1:]])

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "bridge", args[0], "-c", str(self.config), *args[1:]]
        return subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def poll(self, location: str) -> list[dict]:
        """The PollingStatement's PostgreSQL equivalent, as the receive location runs it."""
        t = f'"{self.staging_schema}"."QBridgeToBizTalk"'
        sql = (f'WITH next AS (SELECT "Id" FROM {t} WHERE "ReceiveLocation" = :loc AND "Status" = 0 '
               "AND (\"Due\" IS NULL OR \"Due\" <= now() AT TIME ZONE 'UTC') ORDER BY \"Id\" LIMIT 50 FOR UPDATE SKIP LOCKED) "
               f'UPDATE {t} s SET "Status" = 1, "TakenAt" = now() FROM next WHERE s."Id" = next."Id" RETURNING s.*')
        with self.engine.begin() as conn:
            return [dict(r) for r in conn.execute(sa.text(sql), {"loc": location}).mappings()]


@pytest.fixture()
def bts(pg_server: str, pg_schema: str, pg_schema2: str, tmp_path: Path):
    b = ToBizTalk(tmp_path, pg_server, pg_schema, pg_schema2)
    assert b.cli("init") == 0
    yield b
    b.engine.dispose()


@pytest.mark.postgres
def test_a_message_reaches_the_receive_location_once(bts: ToBizTalk) -> None:
    ep = bts.endpoint
    h = ep.headers("Billing.Messages.InvoiceRequested, Billing.Messages, Version=2.0.0.0", "Send", Tenant="acme")
    ep.send(ep.address("Invoicing"), h, b"<InvoiceRequested xmlns='http://example.org/billing'><Id>7</Id></InvoiceRequested>")
    assert bts.cli("sync", "--once") == 0
    assert bts.cli("sync", "--once") == 0
    [row] = bts.poll("InvoiceIn")
    assert bts.poll("InvoiceIn") == []  # taken once
    assert row["MessageId"] == h["NServiceBus.MessageId"]
    assert row["MessageType"] == "http://example.org/billing#InvoiceRequested"
    assert row["CorrelationId"] == h["NServiceBus.CorrelationId"] and row["Intent"] == "Send"
    assert row["ReplyTo"] == h["NServiceBus.ReplyToAddress"] and row["OriginatingEndpoint"] == "Billing"
    assert bytes(row["Body"]).startswith(b"<InvoiceRequested")
    headers = orjson.loads(row["Headers"])
    assert headers["Tenant"] == "acme" and headers["QBridge.Source"].startswith("nservicebus://")
    assert bts.cli("verify") == 0


@pytest.mark.postgres
@pytest.mark.slow
def test_sigkill_between_the_staging_commit_and_the_nservicebus_delete(bts: ToBizTalk, tmp_path: Path) -> None:
    ep = bts.endpoint
    sent = [ep.headers("Billing.Messages.InvoiceRequested, Billing.Messages", "Send") for _ in range(8)]
    for h in sent:
        ep.send(ep.address("Invoicing"), h, b"<x/>")
    kill_at(bts, "after_target_commit", tmp_path)
    assert bts.cli("sync", "--once") == 0
    taken = bts.poll("InvoiceIn")
    assert sorted(r["MessageId"] for r in taken) == sorted(h["NServiceBus.MessageId"] for h in sent)


def test_staging_table_and_polling_statements_for_sql_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = staging_table("QBridgeToBizTalk", "dbo")
    ddl = re.sub(r"\s+", " ", str(CreateTable(t).compile(dialect=mssql.dialect())))
    assert "[Headers] NVARCHAR(max) NOT NULL" in ddl and "[Body] VARBINARY(max)" in ddl
    assert "[Id] BIGINT NOT NULL IDENTITY" in ddl and "[TimeSent] DATETIME2 NOT NULL" in ddl
    stmts = polling_statements(t, "Invoice'In")
    poll = stmts["PollingStatement"]
    assert poll.startswith("WITH next AS (SELECT TOP (50) * FROM dbo.[QBridgeToBizTalk] WITH (UPDLOCK, ROWLOCK, READPAST)")
    assert "ReceiveLocation = N'Invoice''In'" in poll and "ORDER BY Id) UPDATE next SET Status = 1" in poll
    assert "OUTPUT inserted.Id, inserted.MessageId" in poll
    assert stmts["PolledDataAvailableStatement"].startswith("SELECT COUNT(*) FROM dbo.[QBridgeToBizTalk] WITH (READPAST)")
    (tmp_path / "m.toml").write_text(MAPPING)
    (tmp_path / "c.toml").write_text("""[connections]
nsb = "mssql+pyodbc://u:p@nsb-dsn"
bts = "mssql+pyodbc://u:p@bts-dsn"
[[jobs]]
name = "b"
source = { system = "nservicebus", connection = "nsb", flavor = "sqlserver", queues = ["Invoicing"] }
target = { system = "biztalk", connection = "bts", schema = "dbo" }
mapping = "m.toml"
""")
    assert cli_main(["init", "-c", str(tmp_path / "c.toml"), "--print-sql"]) == 0
    printed = capsys.readouterr().out
    assert "CREATE TABLE dbo.[QBridgeToBizTalk]" in printed
    assert "-- receive location 'InvoiceIn', WCF-SQL PollingStatement:" in printed
