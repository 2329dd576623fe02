"""The drain gate: counts the requests the transports are handling, refuses new ones while the server drains."""

from __future__ import annotations

import asyncio
import threading

from tfship.core.errors import UnavailableError


class RequestGate:
    """Counts the requests the transports are handling, and refuses new ones while the server drains.

    Transports call `enter()` when a request reaches a handler and `leave()` once it is answered, from any
    thread (the REST API runs on its own loop, `serving.loops`). After `close()`, `enter()` raises
    `UnavailableError` (clients retry elsewhere) and `wait_idle()` returns once every admitted request was
    answered.
    """

    POLL_S = 0.005  # wait_idle's polling interval (it may run on another loop than enter/leave)

    def __init__(self) -> None:
        self.active = 0
        self.draining = False
        self._lock = threading.Lock()

    def enter(self) -> None:
        """Admit one request; raises `UnavailableError` while draining."""
        if self.draining:
            raise UnavailableError("server is shutting down; retry on another replica")
        with self._lock:
            self.active += 1

    def leave(self) -> None:
        """One admitted request was answered."""
        with self._lock:
            self.active -= 1

    def close(self) -> None:
        """Start draining: every later `enter()` raises `UnavailableError`."""
        self.draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no admitted request is left (True) or `timeout_s` seconds passed (False)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + max(timeout_s, 0.0)
        while self.active > 0:
            if loop.time() >= end:
                return False
            await asyncio.sleep(min(self.POLL_S, max(end - loop.time(), 0.0)))
        return True
