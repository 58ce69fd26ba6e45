"""Review of session 12's `--batch-size N` (05f637a): the SQL Server bound is checked against every
job of the config, not only those the run selects with `--job`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import Bridge


def test_batch_size_over_2000_is_refused_for_a_selected_job_only_because_an_unselected_one_is_on_sql_server(
        tmp_path: Path) -> None:
    b = Bridge(tmp_path, f"sqlite:///{tmp_path}/l.db", f"sqlite:///{tmp_path}/n.db", batch_size=4)
    text = b.config.read_text()
    job2 = text[text.index("[[jobs]]"):].replace('name     = "job1"', 'name     = "job2"') \
        .replace('connection = "nsb"', 'connection = "nsb_mssql"').replace('"MQueue1"', '"MQueue2"')
    text = text.replace("[[jobs]]", 'nsb_mssql = "mssql+pyodbc://u:p@127.0.0.1:1/nsb?driver=ODBC+Driver+18+for+SQL+Server"\n\n[[jobs]]', 1)
    b.config.write_text(text + "\n" + job2)
    assert b.cli("init", "--job", "job1") == 0
    b.insert(b.ready(10))
    # job1 alone runs, on SQLite only: without the flag it moves
    plain = subprocess.run(b.spawn_args("sync", "--once", "--job", "job1"), check=False, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    b.insert(b.ready(10, start=11))
    r = subprocess.run(b.spawn_args("sync", "--once", "--job", "job1", "--batch-size", "5000"),
                       check=False, capture_output=True, text=True, timeout=120)
    # job2 (SQL Server) takes no part in this run; the flag should apply to job1 only
    assert r.returncode == 0, r.stderr
    assert b.count("Orders") == 20
    b.dispose()
