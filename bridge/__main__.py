"""`python -m bridge ...` is `qbridge ...`; also the file to hand to `spark-submit` (docs/spark.md)."""

import sys

from bridge.cli import main

sys.exit(main())
