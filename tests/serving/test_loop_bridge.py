"""`LoopBridge`: a data plane coroutine runs on the loop that owns it, and a callback it is handed runs back on
the caller's loop (a REST body is parsed on the REST thread, never on the main loop that gRPC needs).

Real loops: the owner is a `TransportLoop` thread, the caller the test's own loop.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from tfship.serving.loops import LoopBridge, TransportLoop


class Owner:
    """Stands for the data plane: records the thread each step ran on."""

    def __init__(self) -> None:
        self.threads: dict[str, str] = {}
        self.limit = 7  # a plain attribute: read as it is

    async def predict_decoded(self, decode):
        self.threads["work"] = threading.current_thread().name
        return await decode("meta") * 2

    async def fail(self):
        raise ValueError("refused on the owner loop")


def test_work_runs_on_the_owner_loop_and_its_callback_back_on_the_callers():
    owner, loop = Owner(), TransportLoop("owner-loop")
    try:
        async def caller():
            async def decode(meta):
                owner.threads["decode"] = threading.current_thread().name
                return len(meta)

            bridge = LoopBridge(owner, loop.loop)
            return await bridge.predict_decoded(decode), bridge.limit

        answer, limit = asyncio.run(caller())
    finally:
        loop.stop()
    assert (answer, limit) == (8, 7)
    assert owner.threads == {"work": "owner-loop", "decode": threading.current_thread().name}


def test_errors_cross_the_bridge_unchanged():
    loop = TransportLoop("owner-loop")
    try:
        with pytest.raises(ValueError, match="refused on the owner loop"):
            asyncio.run(LoopBridge(Owner(), loop.loop).fail())
    finally:
        loop.stop()


class AnyLoopOwner(Owner):
    """A target that lets every loop run `predict_decoded` (as `DataPlane.ANY_LOOP` does)."""

    ANY_LOOP = frozenset({"predict_decoded"})


def test_a_coroutine_the_owner_lists_in_any_loop_runs_on_the_callers_loop():
    owner, loop = AnyLoopOwner(), TransportLoop("owner-loop")
    try:
        async def caller():
            async def decode(meta):
                owner.threads["decode"] = threading.current_thread().name
                return len(meta)

            return await LoopBridge(owner, loop.loop).predict_decoded(decode)

        assert asyncio.run(caller()) == 8
    finally:
        loop.stop()
    here = threading.current_thread().name
    assert owner.threads == {"work": here, "decode": here}
