"""Smoke test of the serving benchmark's load generator against a real server (identity backend).

Starts `python -m tfship.serving` through `ServerProcess` on a free port, runs `bench.serve.loadgen` as its
own process for ~2 s at concurrency 1 and 8, and checks that requests were served with zero errors
and that the JSON result carries every field the report reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serve.models import ModelInfo, request_bytes, write_identity
from tfship.serving.launcher import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {
    "concurrency",
    "window_s",
    "requests",
    "errors",
    "error_codes",
    "inferences_per_s",
    "requests_per_s",
    "latency_ms",
    "server_cpu",
    "loadgen_cpu",
    "mean_batch_rows",
    "server_threads",
    "host_steal",
}


@pytest.mark.parametrize("batching", [False, True], ids=["per-request", "batched"])
def test_loadgen_serves_without_errors(tmp_path: Path, batching: bool) -> None:
    info = ModelInfo("echo", "x", (16,), "test")
    write_identity(tmp_path / "repo" / "echo" / "1", info)
    request = tmp_path / "request.bin"
    request.write_bytes(request_bytes("echo", "x", (16,)))
    extra = ["--rest-port", "-1", "--file-system-poll-wait-seconds", "0"] + (
        ["--enable-batching"] if batching else []
    )
    with ServerProcess(tmp_path / "repo", "echo", "auto", extra, startup_timeout_s=60,
                       module="bench.serve.identity") as server:
        out = tmp_path / "result.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [
            sys.executable,
            "-m",
            "bench.serve.loadgen",
            "--target",
            server.grpc_target,
            "--request-file",
            str(request),
            "--concurrency",
            "1,8",
            "--warmup-s",
            "0.2",
            "--window-s",
            "0.8",
            f"--server-pid={server.process.pid}",
            f"--metrics-url={server.metrics_url}",
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
    levels = json.loads(out.read_text())
    assert [lvl["concurrency"] for lvl in levels] == [1, 8]
    for lvl in levels:
        assert FIELDS <= set(lvl), sorted(FIELDS - set(lvl))
        assert lvl["errors"] == 0, lvl["error_codes"]
        assert lvl["requests"] > 0 and lvl["inferences_per_s"] > 0
        assert set(lvl["latency_ms"]) == {"p50", "p90", "p99", "mean", "max"}
        assert 0 < lvl["latency_ms"]["p50"] <= lvl["latency_ms"]["p99"]
        assert lvl["server_cpu"] > 0
        assert (lvl["mean_batch_rows"] is not None) == batching
        threads = lvl["server_threads"]  # where the server's core went: the event loop did work every request
        assert threads["main"]["cpu_s"] > 0 and threads["main"]["voluntary"] + threads["main"]["involuntary"] > 0
        assert sum(t["cpu_s"] for t in threads.values()) <= lvl["server_cpu"] * lvl["window_s"] * 1.5 + 0.05


def test_handler_cost_measures_the_predict_handler_in_process(tmp_path: Path) -> None:
    info = ModelInfo("identity_echo", "x", (16,), "test")
    write_identity(tmp_path / "repo" / "identity_echo" / "1", info)
    request = tmp_path / "request.bin"
    request.write_bytes(request_bytes("identity_echo", "x", (16,)))
    cmd = [sys.executable, "-m", "bench.serve.handler_cost", "--repo", str(tmp_path / "repo"), "--model",
           "identity_echo", "--request-file", str(request), "--calls", "300", "--repeats", "2", "--evict-mib", "4"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["calls"] == 600 and len(result["repeats"]) == 2 and result["evict_mib"] == 4
    assert 0 < result["us_per_call"] < 10_000  # a real call costs microseconds, never zero
