"""`qbridge run`: every job on its schedule for months, with the listener beside it: Prometheus
metrics, the status page and its cache. The listener reads the workers through a read-only
view (bridge.service.view), never the scheduler itself.

May import: core, codecs, schemas, sources, targets, ledger, pipeline, lifecycle.
"""
