"""Peak resident memory of a process and all its descendants, sampled from /proc (Linux).

`TreeSampler(pid)` polls every `interval_s` in a thread: the sum of `VmRSS` over `pid` and every
process below it (found through `/proc/<pid>/task/<tid>/children`). `peak_bytes` is the largest sum
seen, so short spikes between samples can be missed (20 ms by default).
"""

from __future__ import annotations

import threading
from pathlib import Path


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_rss_bytes(pid: int) -> int:
    """Sum of `rss_bytes` over `pid` and its descendants."""
    return sum(rss_bytes(p) for p in descendants(pid))


class TreeSampler:
    """Context manager sampling `tree_rss_bytes(pid)`; `peak_bytes` after (or during) the block."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.pid, self.interval_s, self.peak_bytes = pid, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(self.pid))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
