"""`python -m tfship.deploy ...` is `tfship deploy ...`."""

import sys

from tfship.deploy.cli import main

sys.exit(main())
