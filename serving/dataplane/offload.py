"""CPU-heavy request decoding in a helper process, so one large request never stalls the event loop.

Threads do not help here: `json.loads` and `np.array(nested lists)` are single C calls that hold the GIL for
their whole run (measured: about 3 s each for a 26 MB REST body), and while they hold it the event loop
cannot answer anything. Payloads above `OFF_LOOP_BYTES` are therefore decoded in a separate process (started
on first use with `spawn`, one worker, killed with the server); small ones are decoded inline, where a
process hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tfship.core.processes import set_parent_death_signal

OFF_LOOP_BYTES = 1 << 20  # payloads above this are decoded in the helper process
HELPER_NICENESS = 10  # the helper runs at a lower CPU priority: bulk decoding yields to the serving threads


def _start_helper() -> None:
    """The helper process' initializer: die with the server, and run at `HELPER_NICENESS` (a large body's
    decoding then takes the CPU the serving threads leave, instead of delaying every small request beside it).
    """
    set_parent_death_signal()
    try:
        os.nice(HELPER_NICENESS)
    except OSError:
        pass


class Offloader:
    """Runs picklable functions in one helper process (lazily started); `run_if_large` decides per payload."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # both transport loops may start it (serving.loops)

    async def run_if_large(self, size: int, function, *args):
        """`function(*args)`: in the helper process when `size` bytes exceed `OFF_LOOP_BYTES`, else inline.
        Exceptions raised by `function` propagate unchanged.
        """
        if size <= OFF_LOOP_BYTES:
            return function(*args)
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start_helper)
            pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, function, *args)
        except BrokenProcessPool:  # the helper died (e.g. killed for memory): start a new one next time
            self._pool = None
            raise

    def close(self) -> None:
        """Stop the helper process (server shutdown)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
