"""Server-side counters a load level reads at the edges of its window (Linux /proc and the servers' /metrics):
CPU seconds per process and per thread group, the host's stolen ticks, and `tfship_batch_size`'s histogram.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def host_cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) clock ticks of every CPU since boot, from the `cpu` line of /proc/stat (proc(5)); None
    where it cannot be read or has no steal column (not Linux, or no hypervisor accounting)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields)) if len(fields) == 8 else None


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Stolen share of the host's CPU ticks between two `host_cpu_ticks` readings (0..1), or None."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15 of stat(5)


def processes_cpu_s(pids: list[int]) -> float:
    """Sum of `process_cpu_s` over `pids` (dead processes count 0), seconds."""
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_s(pid)
        except (OSError, IndexError):
            pass
    return total


def thread_counters(pids: list[int]) -> dict[str, list[float]]:
    """Per thread group of `pids`: [CPU seconds, run-queue wait seconds, voluntary and involuntary context
    switches], summed, from /proc/<pid>/task/<tid>/{schedstat,status}.

    Groups: `main` (the thread whose tid is the pid: the event loop in tfship and the references), else the
    thread's name (`event_engine`, `python` for grpc.aio's poller, `tfship-model_0`... digits dropped).
    """
    groups: dict[str, list[float]] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                run_ns, wait_ns, _slices = Path(f"{base}/schedstat").read_text().split()
                status = Path(f"{base}/status").read_text()
            except (OSError, ValueError):
                continue
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            name = "main" if tid == str(pid) else fields.get("Name", "?").strip().rstrip("0123456789_")
            group = groups.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            group[0] += int(run_ns) / 1e9
            group[1] += int(wait_ns) / 1e9
            group[2] += int(fields.get("voluntary_ctxt_switches", "0"))
            group[3] += int(fields.get("nonvoluntary_ctxt_switches", "0"))
    return groups


def thread_deltas(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """`thread_counters` differences over a window: cpu_s, wait_s, voluntary, involuntary per group."""
    keys = ("cpu_s", "wait_s", "voluntary", "involuntary")
    zero = [0.0] * 4
    return {name: dict(zip(keys, (a - b for a, b in zip(values, before.get(name, zero)))))
            for name, values in after.items()}


def batch_histogram(metrics_urls: list[str]) -> tuple[float, float]:
    """(sum of rows, number of backend calls) of `tfship_batch_size` summed over the servers' /metrics."""
    rows = calls = 0.0
    for url in metrics_urls:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("tfship_batch_size_sum"):
                rows += float(line.rsplit(" ", 1)[1])
            elif line.startswith("tfship_batch_size_count"):
                calls += float(line.rsplit(" ", 1)[1])
    return rows, calls
