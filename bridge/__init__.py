"""qbridge: legacy database queues into NServiceBus SQL-transport tables, exactly once.

The package is built in layers; a module imports only from its own package and the layers
below it (tests/test_import_layers.py holds every module to that, docs/architecture.md draws it).
From the bottom:

- the core, this package's own modules: errors, timefmt, identifiers, settings_io, faults,
  mapping, mapping_rules, model, config, db, retry, tracing. May import: nothing of qbridge but
  the core.
- codecs/: the legacy systems' wire formats (Java serialization, OpenJMS blobs, BizTalk
  context and parts, NGinn headers), the echo tag, legacy values as JSON.
- schemas/: each system's tables, as that system creates them.
- sources/, targets/: one module per system that reads, one per system that writes.
- ledger/: the books that make delivery exactly once (ledger, ranges, totals, checkpoints and
  gaps, fencing epochs, keys in flight, job locks, give-backs owed, steering, failure groups,
  their upgrades).
- pipeline/: the one loop: batches, passes, Spark units and the two engines.
- lifecycle/: what each of the operator's steps does (init, discover, preview, verify,
  rollback, quarantine, prune, inspect).
- service/: `qbridge run`: the scheduler, the listener's metrics and status page.
- demo/: `qbridge demo` and the sample legacy data.
- commands/: the `qbridge` command line, parsing and printing only.
"""

__version__ = "0.1.0"
