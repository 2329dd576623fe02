"""`python -m tfship.serving ...`: run the `serve` command standalone (or `query`)."""

import sys

from tfship.serving.cli import main

sys.exit(main())
