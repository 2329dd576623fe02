"""A worker module for tests/core/test_warm_children.py: `main(argv)` as `python -m tests.core.warm_probe`.

`ok REPORT` writes REPORT with this process's pid; `grow REPORT MIB` also holds MIB mebibytes while it runs;
`kill` sends itself SIGKILL; `hang` sleeps an hour; `raise` raises; `exit N` exits with status N.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    action = argv[0]
    print(f"probe {action} in {os.getpid()}", flush=True)
    if action in ("ok", "grow"):
        if action == "grow":
            held = bytearray(int(argv[2]) * 2**20)
            held[::4096] = b"x" * len(held[::4096])  # touch every page: resident, not just reserved
        Path(argv[1]).write_text(str(os.getpid()))
        return 0
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        time.sleep(3600)
    if action == "raise":
        raise RuntimeError("the probe raised on purpose")
    return int(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
