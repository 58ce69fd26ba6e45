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
DRIVERS = ("adbc_driver_postgresql.dbapi",)  # where it is missing, ArrowReads says so and reads by SQLAlchemy


_done: list[bool] = []  # once imported (a list: no `global` to keep)


def import_lane_modules() -> None:
    """Imports LANE_MODULES and what of DRIVERS is installed, once a process."""
    if _done:
        return
    for name in LANE_MODULES:
        importlib.import_module(name)
    for name in DRIVERS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _done.append(True)
