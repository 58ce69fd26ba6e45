"""`python -m bridge ...` is `qbridge ...`; also the file to hand to `spark-submit` (docs/spark.md)."""

import sys

from bridge.commands.main import main

if __name__ == "__main__":  # not when a worker process (preview's slices) imports it
    sys.exit(main())
