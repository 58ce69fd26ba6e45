"""CPython's cyclic garbage collector, set for a process that moves rows in batches.

A batch makes tens of thousands of short-lived containers (rows, header dicts, tuples, ledger
entries) that reference counting frees as the batch ends. At CPython's default threshold (a
young-generation pass every 700 net new containers) the collector traverses the batch in flight
again and again and, in its full passes, every object the imported libraries hold:
A probe since removed (commit 450edc1, docs/benchmarks.md) counted 2,109 passes taking 0.84 s of a 200k-row unit's 7.3 s, and none
with this setting. Spark workers hold more (PySpark besides), so their passes cost more still.
Cyclic garbage is still collected: at most 50,000 new containers of it wait for a pass."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # net new containers between young-generation passes (CPython: 700)


def for_batches() -> None:
    """Freezes what the process holds now (modules, engines, the job's runners: they live as
    long as the process) out of the collector's passes, and spaces its young-generation passes
    so that one batch's objects do not trigger them. Called once the process has its runners."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
