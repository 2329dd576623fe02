"""One builder at a time for a folder that several processes may create on first use.

`.venv-tfjs`, `tfjs/node/node_modules` and the tests' `.venv-edge` are built the first time something needs
them. Two processes that need one at once (two conversions, two test workers under pytest-xdist) would both
build it into the same folder. `building(path)` holds an exclusive advisory lock (`fcntl.flock`, released by
the kernel when the holder exits however it exits, so a `kill -9` leaves no stale lock) on `<path>.lock` for
the duration of the `with` block: the second process waits, then finds the first one's stamp and returns.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def building(path: Path) -> Iterator[None]:
    """Hold the exclusive build lock of folder `path` (the file `<path>.lock` beside it, created if missing).

    Blocks until no other process holds it. Raises OSError when the lock file cannot be created.
    """
    lock_file = path.with_name(path.name + ".lock")
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
