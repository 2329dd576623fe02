"""Hot swap under load: publish version N+1, let the server load it and unload N, twenty times; RSS measured.

A tfship server (`--file-system-poll-wait-seconds`, TF Serving's default `latest` version policy: only
the newest version is served) watches a repository holding one model. While `load_threads` threads send
`Predict` calls back to back, each cycle copies the version folder to N+1 (under a hidden name, then
renamed, as `publish` does), waits until GetModelStatus shows N+1 AVAILABLE and N gone or END, then
deletes N's folder and reads the server's RSS (`/proc/<pid>/status` VmRSS; the server has no children).

Result: RSS after every cycle (read once the new version has answered 20 calls), its growth from the
first to the last fifth of the swaps (`rss_trend`: low and high envelope), the calls answered and failed
during the swaps, and seconds per swap. `python -m bench.serve.hotswap --source DIR --backend onnx --cycles 20
--out bench/results` writes `hotswap-latest.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from bench.memory import rss_bytes
from bench.serve.endpoints import child_env

MODEL = "swapped"


class Load:
    """`threads` closed-loop Predict callers until `stop()`; counts answers and failures by status."""

    def __init__(self, target: str, inputs: dict[str, np.ndarray], threads: int) -> None:
        self.ok, self.failed, self._stop = 0, {}, threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(target, inputs), daemon=True) for _ in range(threads)]

    def _run(self, target: str, inputs) -> None:
        from tfship.serving.tfs.client import PredictClient, RemoteError

        with PredictClient(target, timeout_s=30) as client:
            while not self._stop.is_set():
                try:
                    client.predict(MODEL, inputs)
                    self.ok += 1
                except RemoteError as err:
                    code = err.status.value if hasattr(err.status, "value") else str(err.status)
                    self.failed[code] = self.failed.get(code, 0) + 1

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def rss_trend(rss: list[int]) -> tuple[float, float]:
    """(growth of the low envelope, growth of the high envelope) of RSS samples taken after each swap: the
    smallest and the largest sample of the last fifth of the swaps against those of the first fifth (at least
    2 samples each; the first sample, before any swap, left out). Single samples swing by about one model's
    memory depending on when the allocator returned the old version's pages; a leak lifts both envelopes."""
    swaps = rss[1:]
    k = max(2, len(swaps) // 5)
    first, last = swaps[:k], swaps[-k:]
    return min(last) / min(first) - 1, max(last) / max(first) - 1


def _wait_swapped(client, version: int, timeout_s: float = 300.0) -> None:
    """Until `version` is AVAILABLE and no other version is (GetModelStatus polled every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = {s.version: s.state.name for s in client.model_status(MODEL)}
        if states.get(version) == "AVAILABLE" and all(s != "AVAILABLE" for v, s in states.items() if v != version):
            return
        time.sleep(0.05)
    raise TimeoutError(f"version {version} not swapped in within {timeout_s} s: {states}")


def _served_some(load: Load, calls: int, timeout_s: float = 10.0) -> None:
    """Until `load` has answered `calls` more requests (or `timeout_s` passed)."""
    target, deadline = load.ok + calls, time.monotonic() + timeout_s
    while load.ok < target and time.monotonic() < deadline:
        time.sleep(0.01)


def _publish(source: Path, model_dir: Path, version: int) -> None:
    staging = model_dir / f".staging-{version}"
    shutil.copytree(source, staging)
    staging.rename(model_dir / str(version))


def hot_swap(source: Path, work: Path, backend: str, cycles: int, inputs: dict[str, np.ndarray],
             load_threads: int = 4, poll_s: float = 0.2) -> dict:
    """Run `cycles` swaps of `source` (a version folder) under load; returns the measurements (RSS in bytes)."""
    from tfship.serving.launcher import ServerProcess
    from tfship.serving.tfs.client import PredictClient

    model_dir = work / "hotswap_repo" / MODEL
    shutil.rmtree(model_dir.parent, ignore_errors=True)
    model_dir.mkdir(parents=True)
    _publish(source, model_dir, 1)
    args = ["--rest-port", "-1", "--file-system-poll-wait-seconds", str(poll_s)]
    rss, swap_s = [], []
    with ServerProcess(model_dir.parent, MODEL, backend, args, env=child_env()) as server, \
            PredictClient(server.grpc_target, timeout_s=30) as client, Load(server.grpc_target, inputs, load_threads) as load:
        pid = server.process.pid
        rss.append(rss_bytes(pid))
        for version in range(2, cycles + 2):
            started = time.perf_counter()
            _publish(source, model_dir, version)
            _wait_swapped(client, version)
            swap_s.append(time.perf_counter() - started)
            shutil.rmtree(model_dir / str(version - 1))
            _served_some(load, 20)  # the new version has answered calls: its lazily built buffers exist
            rss.append(rss_bytes(pid))
        answered, failed = load.ok, dict(load.failed)
    low, high = rss_trend(rss)
    return {"backend": backend, "cycles": cycles, "rss_bytes": rss, "growth_low": low, "growth_high": high,
            "growth": max(low, high, key=abs), "answered": answered, "failed": failed, "swap_s": swap_s,
            "source": str(source)}


def markdown(results: list[dict], uptime_before: str, uptime_after: str) -> str:
    """The hot-swap table (one row per backend) with the 10 % target."""
    lines = ["# Hot swap under load (load N+1, unload N)", "", f"Machine load: before `{uptime_before}`; after "
             f"`{uptime_after}`.", "", "| backend | cycles | RSS before swaps MB | RSS range after swaps MB | low-envelope growth | "
             "high-envelope growth | within 10 % | answered | failed | swap s (median) |",
             "|---|---:|---:|---:|---:|---:|:---:|---:|---:|---:|"]
    for r in results:
        after = r["rss_bytes"][1:]
        lines.append(f"| {r['backend']} | {r['cycles']} | {r['rss_bytes'][0] / 1e6:,.0f} | {min(after) / 1e6:,.0f}-"
                     f"{max(after) / 1e6:,.0f} | {r['growth_low']:+.1%} | {r['growth_high']:+.1%} | "
                     f"{'PASS' if abs(r['growth']) <= 0.10 else 'MISS'} | {r['answered']} | {r['failed'] or 0} | "
                     f"{statistics.median(r['swap_s']):.2f} |")
    lines += ["", "RSS after each cycle (MB): "] + [f"- {r['backend']}: " + ", ".join(f"{b / 1e6:.0f}" for b in
                                                                                    r["rss_bytes"]) for r in results]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    from bench.host import uptime

    p = argparse.ArgumentParser(prog="python -m bench.serve.hotswap")
    p.add_argument("--source", type=Path, required=True, help="a version folder (SavedModel + model.onnx ...)")
    p.add_argument("--backends", default="onnx,saved_model")
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--work", type=Path, default=Path("bench/work"))
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--alias", default="x")
    p.add_argument("--shape", default="784")
    a = p.parse_args(argv)
    shape = tuple(int(s) for s in a.shape.split(","))
    inputs = {a.alias: np.random.default_rng(0).random((1, *shape), dtype=np.float32)}
    before = uptime()
    results = [hot_swap(a.source, a.work, backend, a.cycles, inputs) for backend in a.backends.split(",")]
    after = uptime()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "hotswap-latest.json").write_text(json.dumps({"uptime_before": before, "uptime_after": after,
                                                           "results": results}, indent=1))
    text = markdown(results, before, after)
    (a.out / "hotswap-latest.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
