"""`python -m pipeline.cli ...` is the `tfship` command."""

import sys

from pipeline.cli import main

sys.exit(main())
