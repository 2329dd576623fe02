"""Peak resident memory of a process and all its descendants, sampled from /proc (Linux).

`TreeSampler(pid)` polls every `interval_s` in a thread: the sum of `VmRSS` over `pid` and every
process below it (found through `/proc/<pid>/task/<tid>/children`). `peak_bytes` is the largest sum
seen, so short spikes between samples can be missed (20 ms by default). `run_sampled` runs one child
command under a sampler (the benchmarks' way to measure a stage or a build).
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SampledRun:
    """One child command, run to its end (or killed at its time limit) under a `TreeSampler`.

    Attributes:
        seconds: wall-clock seconds from start to exit.
        peak_rss_bytes: the largest `tree_rss_bytes` sampled (bytes).
        returncode: the exit status (negative: killed by that signal, e.g. -9 past `timeout_s`).
        output: stdout and stderr together, decoded (undecodable bytes replaced).
    """

    seconds: float
    peak_rss_bytes: int
    returncode: int
    output: str

    def tail(self, lines: int) -> str:
        """The last `lines` lines of `output`."""
        return "\n".join(self.output.splitlines()[-lines:])


def run_sampled(command: list[str], timeout_s: float, log: Path, env: dict[str, str] | None = None,
                cwd: Path | None = None, interval_s: float = 0.02) -> SampledRun:
    """Run `command` with stdout and stderr in the file `log`, sampling its process tree's RSS every
    `interval_s` seconds; past `timeout_s` seconds the child is killed (SIGKILL) and its status is returned.
    """
    started = time.perf_counter()
    with open(log, "w+b") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        with TreeSampler(process.pid, interval_s) as sampler:
            try:
                code = process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
        sink.seek(0)
        text = sink.read().decode(errors="replace")
    return SampledRun(time.perf_counter() - started, sampler.peak_bytes, code, text)
