"""The offloader's two lanes: a medium payload never waits behind a large one, and a lane's queue is bounded.

Real helper processes (spawned, as the server spawns them); the functions run are the standard library's, so
the helpers import nothing of the tests. Issue 21: with one helper, three clients looping 60 MB REST bodies
delayed another client's 1.5 MB body by 16-30 s.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import time

import pytest

from tfship.core.errors import ResourceExhaustedError, UnavailableError
from tfship.serving.dataplane import offload
from tfship.serving.dataplane.offload import LARGE_LANE_BYTES, OFF_LOOP_BYTES, Offloader

MEDIUM, LARGE = OFF_LOOP_BYTES + 1, LARGE_LANE_BYTES + 1
SLOW_S = 4.0


async def _warm(offloader: Offloader) -> None:
    """Start both lanes' helpers, so the timings below measure queueing, not process start-up."""
    assert await offloader.run_if_large(MEDIUM, operator.add, 1, 2) == 3
    assert await offloader.run_if_large(LARGE, operator.add, 2, 2) == 4


def test_a_medium_payload_is_answered_while_a_large_one_is_decoding():
    async def scenario():
        offloader = Offloader()
        try:
            await _warm(offloader)
            large = asyncio.ensure_future(offloader.run_if_large(LARGE, time.sleep, SLOW_S))
            await asyncio.sleep(0.2)  # the large lane is busy
            started = time.monotonic()
            answer = await offloader.run_if_large(MEDIUM, operator.mul, 6, 7)
            return answer, time.monotonic() - started, large.done(), await large
        finally:
            offloader.close()

    answer, waited_s, large_done, _ = asyncio.run(scenario())
    assert answer == 42
    assert not large_done, f"the medium payload waited {waited_s:.1f} s, until the large one ended"


def test_small_payloads_run_inline():
    async def scenario():
        offloader = Offloader()
        try:
            return await offloader.run_if_large(OFF_LOOP_BYTES, operator.add, 1, 1), offloader._medium.held
        finally:
            offloader.close()

    assert asyncio.run(scenario()) == (2, 0)


def test_a_lane_holds_a_bounded_number_of_bytes(monkeypatch):
    monkeypatch.setattr(offload, "LANE_QUEUE_BYTES", 2 * LARGE - 1)  # one large payload fits, two do not

    async def scenario():
        offloader = Offloader()
        try:
            await _warm(offloader)
            first = asyncio.ensure_future(offloader.run_if_large(LARGE, time.sleep, 1.0))
            await asyncio.sleep(0.1)
            with pytest.raises(ResourceExhaustedError) as refused:
                await offloader.run_if_large(LARGE, operator.add, 1, 1)
            medium = await offloader.run_if_large(MEDIUM, operator.add, 1, 1)  # the other lane is not full
            await first
            after = await offloader.run_if_large(LARGE, operator.add, 2, 3)  # room again once it ended
            alone = await offloader.run_if_large(3 * LARGE, operator.add, 3, 3)  # an empty lane takes any one
            return str(refused.value), medium, after, alone, offloader._large.held
        finally:
            offloader.close()

    message, medium, after, alone, held = asyncio.run(scenario())
    assert message == (f"{LARGE} bytes of requests are already waiting to be decoded in the large lane (at most "
                       f"{2 * LARGE - 1}); this request of {LARGE} bytes is refused, retry later")
    assert (medium, after, alone, held) == (2, 5, 6, 0)


def _helper_pid(offloader: Offloader, lane: str) -> int:
    """The process id of `lane`'s (started) helper."""
    return offloader.run_if_large(MEDIUM if lane == "medium" else LARGE, os.getpid)


def test_a_killed_helper_is_replaced_and_the_request_it_held_is_unavailable():
    # Issue 21: after a kill -9 of both helpers, the payload decoding in one was answered 500 and the next payload
    # of the other (idle) lane was answered 500 as well, finding its pool broken.
    async def scenario():
        offloader = Offloader()
        try:
            medium_pid, large_pid = await _helper_pid(offloader, "medium"), await _helper_pid(offloader, "large")
            os.kill(medium_pid, signal.SIGKILL)  # idle
            decoding = asyncio.ensure_future(offloader.run_if_large(LARGE, time.sleep, SLOW_S))
            await asyncio.sleep(0.5)
            os.kill(large_pid, signal.SIGKILL)  # mid-decode
            with pytest.raises(UnavailableError) as stopped:
                await decoding
            await asyncio.sleep(0.2)  # the executor notices the idle helper's death
            return (str(stopped.value), await offloader.run_if_large(MEDIUM, operator.add, 1, 2),
                    await offloader.run_if_large(LARGE, operator.add, 2, 2), offloader._medium.held,
                    offloader._large.held, await _helper_pid(offloader, "medium") != medium_pid)
        finally:
            offloader.close()

    message, medium, large, medium_held, large_held, replaced = asyncio.run(scenario())
    assert message == (f"the large lane's decoding process stopped while decoding this request of {LARGE} bytes; "
                       "retry")
    assert (medium, large, medium_held, large_held, replaced) == (3, 4, 0, 0, True)
