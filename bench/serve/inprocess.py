"""The in-process limit: one backend called directly (no RPC, no queue), rows per second.

`python -m bench.serve.inprocess --version-dir DIR --backend onnx --alias x --shape 784 --batch 1,32`
loads the runtime the server would (same `RuntimeOptions`), warms up, then calls `predict()` back to
back on one thread for `--window-s` seconds per batch size and prints a JSON list of
`{"batch", "calls", "inferences_per_s", "call_ms", "cpu"}` (cpu in cores: process CPU s / wall s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def measure(
    runtime, alias: str, shape: tuple[int, ...], batch: int, warmup_s: float, window_s: float
) -> dict:
    """Call `runtime.predict` with `batch` random rows for `warmup_s` then `window_s` seconds; returns the rates."""
    x = {alias: np.random.default_rng(0).random((batch, *shape), dtype=np.float32)}
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        runtime.predict(x)
    calls, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while (now := time.perf_counter()) - t0 < window_s:
        runtime.predict(x)
        calls += 1
    wall = now - t0
    return {
        "batch": batch,
        "calls": calls,
        "inferences_per_s": calls * batch / wall,
        "call_ms": wall / calls * 1e3,
        "cpu": (time.process_time() - cpu0) / wall,
    }


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.serve.inprocess")
    p.add_argument("--version-dir", type=Path, required=True)
    p.add_argument("--backend", required=True)
    p.add_argument("--alias", required=True, help="input alias of serving_default")
    p.add_argument("--shape", required=True, help="one row's shape, comma-separated (e.g. 8,8,1)")
    p.add_argument("--batch", default="1,32", help="batch sizes, comma-separated")
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--window-s", type=float, default=3.0)
    p.add_argument("--intra-op-threads", type=int, default=0)
    p.add_argument("--inter-op-threads", type=int, default=0)
    p.add_argument("--cpu", type=int, action="append", default=[], help="pin to these cores")
    args = p.parse_args(argv)
    if args.cpu:
        os.sched_setaffinity(0, set(args.cpu))
    from bench.serve.identity import register
    from tfship.serving.runtimes import REGISTRY, RuntimeOptions

    register()

    options = RuntimeOptions(
        intra_op_threads=args.intra_op_threads, inter_op_threads=args.inter_op_threads, use_gpu=False
    )
    runtime = REGISTRY.create(args.backend, args.version_dir, options)
    runtime.load()
    shape = tuple(int(s) for s in args.shape.split(","))
    rows = [
        measure(runtime, args.alias, shape, int(b), args.warmup_s, args.window_s)
        for b in args.batch.split(",")
    ]
    sys.stdout.write(json.dumps(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
