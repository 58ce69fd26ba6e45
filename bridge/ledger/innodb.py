"""Where the books' locking statements must go by primary key, one key a statement.

InnoDB (MariaDB, MySQL) under REPEATABLE READ locks every record a locking statement's scan
passes, with the gap before it, and waits on any record another transaction inserted and has
not committed. On the books' small tables its planner serves an IN list, or a column no index
leads with, by a full scan (EXPLAIN: type ALL), so a DELETE ... IN of a few ids waited on a
pass's uncommitted ledger entries or totals rows while holding the gap where its next entry
went, and InnoDB killed one of the two ("Deadlock found"). By primary key, a statement locks
that record alone (tests/review/test_quarantine_fold_review.py,
tests/review/test_mariadb_scan_locks_review.py). PostgreSQL, SQL Server and SQLite take no
such gap locks: there the IN lists stay, a statement a thousand keys.
"""

from __future__ import annotations

import sqlalchemy as sa


def locks_what_it_scans(conn: sa.Connection) -> bool:
    """True where a locking statement must name each row by its primary key (InnoDB)."""
    return conn.dialect.name in ("mysql", "mariadb")
