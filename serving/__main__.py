"""`python -m serving ...`: run the `serve` command standalone (or `query`)."""

import sys

from serving.cli import main

sys.exit(main())
