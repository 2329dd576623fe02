"""`python -m deploy ...` is `tfship deploy ...`."""

import sys

from deploy.cli import main

sys.exit(main())
