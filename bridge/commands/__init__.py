"""The `qbridge` command line (contract in GUIDE.md and docs/commands.md): the parser and one
module per command family. Parsing and printing only: what a command does lives below.

May import: core, codecs, schemas, sources, targets, ledger, pipeline, lifecycle, service, demo.
"""
