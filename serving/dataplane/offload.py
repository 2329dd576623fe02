"""CPU-heavy request decoding in helper processes, so one large request never stalls the event loop, and a
client's huge bodies never queue another client's medium ones.

Threads do not help here: `json.loads` and `np.array(nested lists)` are single C calls that hold the GIL for
their whole run (measured: about 3 s each for a 26 MB REST body), and while they hold it the event loop
cannot answer anything. Payloads above `OFF_LOOP_BYTES` are therefore decoded in a separate process (started
on first use with `spawn`, killed with the server); small ones are decoded inline, where a process hop would
cost more than the work.

Payloads go to one of two lanes by size, each its own helper process: up to `LARGE_LANE_BYTES` the medium
lane, above it the large lane. With one helper, three clients looping 60 MB bodies delayed another client's
1.5 MB body by 16-30 s; the medium lane never waits behind a large body. Each lane holds at most
`LANE_QUEUE_BYTES` of payloads (queued or decoding; one payload is always taken when the lane is empty): a
payload that would go past it is refused RESOURCE_EXHAUSTED, naming the lane and the bound, so a flood of large
bodies costs bounded memory and bounded waiting instead of growing both.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tfship.core.errors import ResourceExhaustedError, UnavailableError
from tfship.core.processes import set_parent_death_signal
from tfship.serving.affinity import process_cpus, restore_cpus
from tfship.serving.dataplane.memory import release_freed_memory

OFF_LOOP_BYTES = 1 << 20  # payloads above this are decoded in a helper process
LARGE_LANE_BYTES = 8 << 20  # payloads above this go to the large lane, the others to the medium lane
LANE_QUEUE_BYTES = 256 << 20  # payload bytes one lane holds at most, queued or decoding
HELPER_NICENESS = 10  # the helpers run at a lower CPU priority: bulk decoding yields to the serving threads


def _start_helper(cpus: frozenset[int] | None = None) -> None:
    """A helper process' initializer: die with the server, run on the server's CPUs `cpus` (not the one core of
    the transport thread that started it, `serving.affinity`), and at `HELPER_NICENESS` (a large body's
    decoding then takes the CPU the serving threads leave, instead of delaying every small request beside it).
    """
    set_parent_death_signal()
    restore_cpus(cpus)
    try:
        os.nice(HELPER_NICENESS)
    except OSError:
        pass


def _new_pool() -> ProcessPoolExecutor:
    """One lane's executor: a single `spawn`ed helper process, started on first use."""
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_start_helper,
                               initargs=(process_cpus(),))


def _run_and_trim(function, args: tuple):
    """`function(*args)` in a helper, then its freed heap handed back to the OS (`memory.release_freed_memory`):
    a 60 MB JSON body parses to about 800 MB of Python lists, which glibc would otherwise keep in the helper.
    """
    try:
        return function(*args)
    finally:
        release_freed_memory()


class _Lane:
    """One helper process (lazily started) and the payload bytes it holds; safe from both transport loops."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.held = 0  # payload bytes queued or decoding
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # both transport loops use it (serving.loops)

    async def run(self, size: int, function, *args):
        with self._lock:
            if self.held and self.held + size > LANE_QUEUE_BYTES:
                raise ResourceExhaustedError(
                    f"{self.held} bytes of requests are already waiting to be decoded in the {self.name} lane "
                    f"(at most {LANE_QUEUE_BYTES}); this request of {size} bytes is refused, retry later")
            pool = self._pool = self._pool or _new_pool()
            self.held += size
        try:
            loop = asyncio.get_running_loop()
            try:
                future = loop.run_in_executor(pool, _run_and_trim, function, args)
            except BrokenProcessPool:  # the helper died while idle (killed for memory, kill -9): a fresh one
                pool = self._replace(pool)
                future = loop.run_in_executor(pool, _run_and_trim, function, args)
            return await future
        except BrokenProcessPool:  # the helper died decoding this payload: the next payload starts a new one
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            raise UnavailableError(f"the {self.name} lane's decoding process stopped while decoding this request "
                                   f"of {size} bytes; retry") from None
        finally:
            with self._lock:
                self.held -= size

    def _replace(self, broken: ProcessPoolExecutor) -> ProcessPoolExecutor:
        """A new pool in place of `broken`, found dead at submit (or the one another caller put there first)."""
        with self._lock:
            if self._pool is broken or self._pool is None:
                broken.shutdown(wait=False, cancel_futures=True)
                self._pool = _new_pool()
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class Offloader:
    """Runs picklable functions in the helper processes of two size lanes; `run_if_large` decides per payload."""

    def __init__(self) -> None:
        self._medium, self._large = _Lane("medium"), _Lane("large")

    async def run_if_large(self, size: int, function, *args):
        """`function(*args)`: inline when `size` bytes are at most `OFF_LOOP_BYTES`, else in the helper process of
        the medium lane (up to `LARGE_LANE_BYTES`) or the large lane. Exceptions raised by `function` propagate
        unchanged.

        Raises:
            ResourceExhaustedError: the lane already holds `LANE_QUEUE_BYTES` with this payload (names both).
            UnavailableError: the helper died while decoding this payload (UNAVAILABLE / 503; the next payload
                starts a new helper, as does a payload that finds its lane's helper dead while idle).
        """
        if size <= OFF_LOOP_BYTES:
            return function(*args)
        return await (self._medium if size <= LARGE_LANE_BYTES else self._large).run(size, function, *args)

    def close(self) -> None:
        """Stop the helper processes (server shutdown)."""
        self._medium.close()
        self._large.close()
