"""Each transport on its own event loop, so one protocol's load cannot starve another's.

Served on one loop, 32 REST keep-alive clients took every turn of it: gRPC `Predict` fell from about 1,000
answers/s alone to 0 (bench/serve/mixed_load.py). The REST API now runs on a `TransportLoop` (a thread with
its own asyncio loop); gRPC, the data plane and the model manager stay on the main loop. The two threads take
the GIL in turns (CPython hands it over every `sys.getswitchinterval()`, 5 ms), so under a mix each side
keeps about half of the server instead of what the busier loop leaves. HTTP parsing, JSON decoding and
encoding run on the REST thread; a `LoopBridge` hands each data plane coroutine (metadata, predict, ...) to
the main loop and awaits its answer, so the manager's loading and unloading keep one loop. The per-request
coroutines the target lists in `ANY_LOOP` (the data plane's predicts) run on the caller's own loop instead: a
REST request is then served on the REST thread from its first byte to its last, and the main thread is left to
gRPC. (Bridged, a REST request's data-plane work took main-loop turns, and gRPC kept 0.26-0.38 of its solo
rate beside REST load.) Coroutine functions passed across the bridge run back on the caller's loop. Both
threads run on one shared core (`serving.affinity`): the GIL's handovers then cost no cross-core traffic.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import TypeVar, cast

LAG_INTERVAL_S = 0.5  # how often `watch_lag` measures its loop


class TransportLoop:
    """A daemon thread running its own asyncio event loop until `stop()`.

    Args:
        name: the thread's name (shows in `py-spy` and the bench's per-thread CPU counters).
        on_start: called first on the new thread (`serving.affinity.CoreShare.join`).
    """

    def __init__(self, name: str, on_start: Callable[[], None] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._on_start = on_start
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        if self._on_start is not None:
            self._on_start()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.close()

    async def run(self, coroutine: Coroutine):
        """Run `coroutine` on this loop and await its result from the calling loop (exceptions propagate;
        cancelling the caller cancels it).
        """
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the loop (pending callbacks are dropped) and wait up to `timeout_s` seconds for the thread."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)


class LoopBridge:
    """`target` (the `DataPlane`) as seen from another loop: its coroutine methods run on `loop`, the loop that
    owns it, and are awaited from the caller's; plain attributes and methods are used as they are (reads of
    counters and states, safe under the GIL). Request-log context travels with each call (contextvars are
    copied into the task `run_coroutine_threadsafe` starts).
    """

    def __init__(self, target, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str):
        value = getattr(self._target, name)
        if not inspect.iscoroutinefunction(value) or name in getattr(self._target, "ANY_LOOP", ()):
            return value  # a plain attribute, or a coroutine its owner lets every loop run
        loop = self._loop

        async def on_owner_loop(*args, **kwargs):
            home = asyncio.get_running_loop()
            args = [_run_on(home, a) if inspect.iscoroutinefunction(a) else a for a in args]
            kwargs = {k: _run_on(home, a) if inspect.iscoroutinefunction(a) else a for k, a in kwargs.items()}
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(value(*args, **kwargs), loop))

        return on_owner_loop


_T = TypeVar("_T")


def bridged(target: _T, loop: asyncio.AbstractEventLoop) -> _T:
    """`LoopBridge(target, loop)`, typed as the `target` it stands for (every attribute of `target`, its coroutine
    methods run on `loop`).
    """
    return cast(_T, LoopBridge(target, loop))  # cast: LoopBridge forwards each attribute (__getattr__) as its target's


def _run_on(home: asyncio.AbstractEventLoop, callback):
    """`callback` (a coroutine function handed across a `LoopBridge`) run back on `home`, the loop it came from:
    a REST handler's `decode` (JSON parsing, list conversion) stays on the REST thread instead of taking the
    main loop's turns from gRPC.
    """
    async def at_home(*args, **kwargs):
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(callback(*args, **kwargs), home))

    return at_home


async def watch_lag(observe: Callable[[float], None], interval_s: float = LAG_INTERVAL_S) -> None:
    """Until cancelled, sleep `interval_s` seconds on the running loop and `observe(seconds late)`: how long the
    loop took past the timer to run this coroutine again (0 on an idle loop; seconds on a starved one). The
    server feeds `tfship_event_loop_lag_seconds{loop=...}` with it, one watcher per transport loop.
    """
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(loop.time() - due, 0.0))
