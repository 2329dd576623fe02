"""The transport loops' threads share one CPU core: one GIL, whose handovers then stay on one core.

The REST API and gRPC each have their own event loop and thread (`serving.loops`), and both run Python under
one GIL, so together they use about one core at most. Free to run on any core, the two threads hand the GIL
across cores at every turn, and the interpreter's shared state (reference counts of common objects, the
allocator's pools) moves with it. Under a saturating mix of gRPC and REST on 2 cores each request cost about
1.45 times its solo CPU (gRPC Predict 0.84 vs 0.61 ms, REST `:predict` 0.89 vs 0.58 ms), and the two
protocols' shares of their solo throughput summed to 0.64-1.15 (median 0.83 over 10 pairs). With the serving
threads on one core they summed to 0.98-1.27 (median 1.02 over 13; `bench/serve/mixed_load.py`, figures in
docs/security.md).

Pinned to the shared core: the main thread (gRPC and the data plane), the REST loop's thread, and the data
plane's predict threads (a model call that is not cheap enough to run on the loop: the GIL is taken around it).
Threads and processes started by a pinned thread start pinned on Linux, so each loop's default executor
(`asyncio.to_thread`: encoding large answers, rendering metrics) stays on the shared core too, while the
model-loading executor (`CoreShare.executor`) and the decoding helper processes (`restore_cpus`) set theirs
back to the process' CPU set. Model execution keeps every core: a runtime's own thread pools (TensorFlow's,
ONNX Runtime's, LiteRT's) are made while it loads; only a call's calling thread is on the shared core.

The core is the i-th of the process' CPU set for `--num-processes` worker i, otherwise chosen by process id,
so that servers on one host spread over its cores. Nothing is pinned with fewer than 2 CPUs, where
`os.sched_setaffinity` is missing, or with `--spread-transport-threads`.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)
WORKER_INDEX_ENV = "TFSHIP_WORKER_INDEX"  # set by a `--num-processes` parent: worker i takes the i-th core
_PROCESS_CPUS: frozenset[int] | None = None


def process_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on, read once, before any thread is pinned; None without
    `os.sched_getaffinity` (not Linux).
    """
    global _PROCESS_CPUS
    if _PROCESS_CPUS is None and hasattr(os, "sched_getaffinity"):
        _PROCESS_CPUS = frozenset(os.sched_getaffinity(0))
    return _PROCESS_CPUS


def restore_cpus(cpus: frozenset[int] | None) -> None:
    """Let the calling thread run on `cpus` again (a child process' or worker thread's first step); a CPU set
    the kernel refuses (an emptied cgroup) is logged and left as it is.
    """
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as err:
            log.warning("could not restore the CPU set %s: %s", sorted(cpus), err)


class CoreShare:
    """The core that the transport threads share, or none (see the module doc).

    Args:
        enabled: False leaves every thread where the OS puts it (`--spread-transport-threads`).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.cpus = process_cpus()
        ordered = sorted(self.cpus or ())
        index = int(os.environ.get(WORKER_INDEX_ENV) or os.getpid())
        self.core: int | None = ordered[index % len(ordered)] if enabled and len(ordered) > 1 else None

    def join(self) -> None:
        """Pin the calling thread (a transport loop's) to the shared core; nothing when there is none."""
        if self.core is None:
            return
        try:
            os.sched_setaffinity(0, {self.core})
        except OSError as err:  # a CPU taken away since start: serve unpinned
            log.warning("transport thread not pinned to CPU %d: %s", self.core, err)

    def unpin(self) -> None:
        """Give the calling thread the process' CPU set back (an executor thread's initializer)."""
        if self.core is not None:
            restore_cpus(self.cpus)

    def executor(self, max_workers: int | None = None, thread_name_prefix: str = "", *,
                 pinned: bool = False) -> ThreadPoolExecutor:
        """A thread pool whose threads run on every CPU of the process, even when a pinned thread starts them,
        or, `pinned`, on the shared core, whichever thread starts them.
        """
        return ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix,
                                  initializer=self.join if pinned else self.unpin)


def lower_thread_priority(nice: int) -> None:
    """Give the calling thread nice value `nice` (0..19; Linux sets it per thread), so that on a shared core the
    threads at the process' own value (the transport loops) run first; a thread already at `nice` or above, or an
    OS without per-thread priorities, is left as it is. A refusal (a container without the right) is logged.
    """
    if nice <= 0 or not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as err:
        log.warning("thread priority not lowered to nice %d: %s", nice, err)
