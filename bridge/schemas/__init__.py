"""Each system's tables, as that system itself creates them (facts from the reference notes):
OpenJMS's store, the BizTalk MessageBox's spool and work queues, the NServiceBus SQL
transport's queue, delayed and subscription tables in both flavors. Read by the source of a
system and written by its target alike, so they sit below both.

May import: core.
"""
