"""The one framework-owned loop every engine runs: a job's setup, a batch (fast lane and
validated path), passes per cursor kind, Spark's units of work, and the two engines (in
process for `sync --once`, Spark for `migrate`), with what they measure.

May import: core, codecs, schemas, sources, targets, ledger.
"""
