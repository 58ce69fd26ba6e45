"""CPython's cyclic garbage collector, set for a process that moves rows in batches.

A batch makes tens of thousands of short-lived containers (rows, header dicts, tuples, ledger
entries) that reference counting frees as the batch ends; they form no cycles. At CPython's
default threshold (a young-generation pass every 700 net new containers) the collector ran
~1,900 times over 200k NGinn rows, traversing the batch in flight and, in its full passes,
every object the imported libraries hold: 0.7 s of 4.7 s of the row path's CPU
(bench/unit_split.py's unit, timed with gc.callbacks). With the start-up objects frozen and
a pass every 50,000 net new containers it runs a few times, or not at all, per unit.
Cyclic garbage still gets collected: at most 50,000 containers of it wait for a pass.
"""

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
