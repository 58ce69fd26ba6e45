"""What each of the operator's steps does, one module per step: init (the tables a config
needs), check (every statement a job runs, run on its own connections and rolled back), discover
(what a legacy database holds) and its starter config, preview, verify and
status (the books from both databases) with `--deep`, rollback, quarantine replay and
discard, prune, and inspecting one legacy blob. Printing belongs to bridge.commands.

May import: core, codecs, schemas, sources, targets, ledger, pipeline.
"""
