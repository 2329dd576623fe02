"""tfship's Predict handler alone: CPU per call with no transport, on an idle core.

Builds the data plane the server builds (model manager, metrics, limits) over one version folder of
the `identity` backend, then awaits `PredictionServicer.Predict` in a loop on a parsed request and
serialises each reply, as grpc would around it. What it measures is the Python work tfship adds per
request; `make bench-serve` sets it beside the main-thread CPU per request of the pinned server under
load (`bench.serve.report`), which shows how much more the same work costs when it shares the core
with grpc's threads.

    python -m bench.serve.handler_cost --repo REPO --model identity_mlp --request-file REQ.bin [--cpu 0]

Prints one JSON object: `us_per_call` (CPU microseconds per call, median of `--repeats`), `calls`.
`--evict-mib 64` measures the same calls with the caches evicted before each one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def _wire(reply) -> bytes:
    """What grpc sends for a handler's answer (`serving.grpc_calls`: bytes as they are, a message serialised)."""
    return reply if isinstance(reply, bytes) else reply.SerializeToString()


class _Context:
    """The one `grpc.aio.ServicerContext` method `Predict` calls on success (no deadline)."""

    def time_remaining(self) -> None:
        return None


async def measure(repo: Path, model: str, request: bytes, calls: int, repeats: int, evict_mib: int = 0) -> dict:
    """CPU microseconds per `Predict` call (parse, handler, serialise), median of `repeats` loops of `calls`.

    `evict_mib` > 0: before each call, write a buffer of that many MiB (outside the timed part), so every
    call starts with the caches holding something else, as in a server whose core runs grpc's work between
    two requests; 64 MiB is twice this machine's L3.
    """
    from bench.serve.identity import register
    from tfship.core import protocol
    from tfship.serving.dataplane.manager import ModelManager
    from tfship.serving.dataplane.model_config import from_repository
    from tfship.serving.dataplane.service import DataPlane
    from tfship.serving.dataplane.types import ServerLimits
    from tfship.serving.operations.metrics import Metrics
    from tfship.serving.runtimes.base import RuntimeOptions
    from tfship.serving.tfs.grpc_service import PredictionServicer

    register()
    metrics, executor = Metrics(), ThreadPoolExecutor(2)
    manager = ModelManager("identity", RuntimeOptions(intra_op_threads=1, inter_op_threads=1), executor,
                           metrics=metrics)
    dataplane = DataPlane(manager, executor, ServerLimits(), metrics)
    await manager.apply_config(from_repository(repo, model))
    servicer, context, parse = PredictionServicer(dataplane), _Context(), protocol.PredictRequest.FromString
    for _ in range(500):  # warm-up: the first calls go to a thread until the backend's cost is measured
        _wire(await servicer.Predict(parse(request), context))
    per_call, clock = [], time.thread_time
    evict = np.zeros(evict_mib << 18, np.float32) if evict_mib > 0 else None
    for _ in range(repeats):
        spent = 0.0
        for _ in range(calls):
            if evict is not None:
                evict += 1.0
            started = clock()
            _wire(await servicer.Predict(parse(request), context))
            spent += clock() - started
        per_call.append(spent / calls * 1e6)
    executor.shutdown(wait=False)
    return {"us_per_call": statistics.median(per_call), "calls": calls * repeats, "repeats": per_call,
            "evict_mib": evict_mib}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.serve.handler_cost", description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--model", default="identity_mlp")
    p.add_argument("--request-file", type=Path, required=True)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpu", type=int, default=None, help="core to pin this process to")
    p.add_argument("--evict-mib", type=int, default=0, help="MiB written between calls to evict the caches")
    a = p.parse_args(argv)
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    print(json.dumps(asyncio.run(measure(a.repo, a.model, a.request_file.read_bytes(), a.calls, a.repeats, a.evict_mib))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
