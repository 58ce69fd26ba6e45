"""`qbridge demo` and the sample legacy data it (and the tests and benchmarks) are made of:
NGinn, OpenJMS and BizTalk rows shaped as those systems write them, with real blobs in data/.

May import: core, codecs, schemas, sources, targets, ledger, pipeline, lifecycle.
"""
