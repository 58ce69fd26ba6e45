"""The books that make delivery exactly once, kept in the target database beside the queue
rows and written in the same transactions: the ledger and its ranges, per-queue totals,
checkpoints with their id gaps, keys pending and in flight, the quarantine table, fencing
epochs and the job locks they guard, the give-backs a move-mode rollback owes, and the
upgrades of books an earlier qbridge made.

May import: core, codecs, schemas, sources, targets.
"""
