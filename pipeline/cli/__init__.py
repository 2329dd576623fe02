"""The `tfship` command line: the parser and entry point (`app`), the shared arguments and the handlers.

`main` is re-exported here because the console script is `tfship.pipeline.cli:main`.
"""

from tfship.pipeline.cli.app import main

__all__ = ["main"]
