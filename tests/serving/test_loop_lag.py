"""Each transport loop's lag is measured and exported, so a starved protocol shows in the metrics.

Issue 21: REST load once took every turn of the one event loop, gRPC answered 20-58 calls/s with a p99 of
30 s, and nothing in the metrics showed it. `tfship_event_loop_lag_seconds{loop=grpc|rest}` now does.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request

from tfship.serving.launcher import ServerProcess
from tfship.serving.loops import watch_lag

MODEL = "digits"


def test_a_blocked_loop_is_reported_late_by_about_the_time_it_was_blocked():
    async def scenario() -> list[float]:
        seen: list[float] = []
        watcher = asyncio.create_task(watch_lag(seen.append, interval_s=0.05))
        await asyncio.sleep(0.12)  # two or so on-time turns
        time.sleep(0.4)  # the loop is blocked, as a long GIL-holding call would block it
        await asyncio.sleep(0.12)
        watcher.cancel()
        return seen

    seen = asyncio.run(scenario())
    assert min(seen) < 0.05, seen
    assert 0.3 <= max(seen) < 1.0, seen


def test_the_server_exports_both_transport_loops_lag(repository):
    with ServerProcess(repository, MODEL, backend="tflite") as server:
        time.sleep(1.5)  # a few watcher turns (every 0.5 s)
        text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10).read().decode()
    counts = dict(re.findall(r'^tfship_event_loop_lag_seconds_count\{loop="(\w+)"\} (\S+)$', text, re.M))
    assert set(counts) == {"grpc", "rest"}, text[-2000:]
    assert all(float(v) >= 1 for v in counts.values()), counts
