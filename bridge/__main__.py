"""`python -m bridge ...` is `qbridge ...`; also the file to hand to `spark-submit` (README)."""

import sys

from bridge.cli import main

sys.exit(main())
