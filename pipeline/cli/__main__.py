"""`python -m tfship.pipeline.cli ...` is the `tfship` command."""

import sys

from tfship.pipeline.cli import main

sys.exit(main())
