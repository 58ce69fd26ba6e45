"""The modules a batch's columnar lane and a read-ahead import on their first batch (Arrow,
ADBC's driver, the lane's own), imported at once by one thread before a second thread may run a
pass: two threads importing pyarrow at once can see it half made ("cannot import name 'BuildInfo'
from partially initialized module 'pyarrow.lib'"), which now and then failed a fresh process's
first pass. Called by the thread that starts a read-ahead and by `qbridge run` before its
scheduler's threads run their first ticks; after the first call it costs a dictionary lookup."""

from __future__ import annotations

import importlib

# Imported lazily elsewhere so that commands that run no lane do without them.
LANE_MODULES = (
    "numpy", "numpy.ma", "pyarrow", "pyarrow.compute",
    "bridge.sources.arrow_fetched", "bridge.sources.columns", "bridge.sources.nginn_lane",
    "bridge.sources.plain_lane", "bridge.targets.envelope_columns",
)
RULE_MODULES = ("bridge.targets.lane_rules", "bridge.targets.when_columns")  # a mapping's rules on the lane (~0.6 s)
# Where one is missing or broken, its user says so: ArrowReads reads by SQLAlchemy, and the writer
# meets pgpq's error on its first COPY, as it would without this.
OPTIONAL = ("pgpq", "adbc_driver_postgresql.dbapi")
_done: set[str] = set()  # "lane", and "rules" once RULE_MODULES are imported too


def import_lane_modules(rules: bool = False) -> None:
    """Imports LANE_MODULES, what of OPTIONAL imports, and with `rules` RULE_MODULES, once a process."""
    want = {"lane", "rules"} if rules else {"lane"}
    if want <= _done:
        return
    for name in (*LANE_MODULES, *(RULE_MODULES if rules else ())):
        importlib.import_module(name)
    for name in OPTIONAL:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S110 - its user reports it (above)
            pass
    _done.update(want)
