"""`make bench-serve`: tfship's serving path against its two references, measured in one run.

Per model (`digits`, the small CNN; `mlp`, 784 -> 4x1024 -> 10) every server below is started once,
pinned to the server core, and kept up; then `--repeats` rounds each load every server in turn
(alternating, so a noisy minute hits all of them alike) with batch-1 `Predict` calls at each
concurrency level from a load generator pinned to the other core (`bench.serve.loadgen`):

* `bare`: 60-line `grpc.aio` server answering with prebuilt bytes (tfship's identity reply);
* `echo`: hand-written `grpc.aio` handler doing the least any handler that reads a `Predict` does: parse it, view
  each input (`np.frombuffer`), send it back (`bench.serve.echo_server`); the floor under `identity`;
* `identity`: tfship with its `identity` backend (transport and tfship's per-request code, no model);
* `ort`: hand-written per-request ONNX Runtime grpcio server (`bench.serve.ort_server`);
* `ort_batching`: hand-written grpc.aio micro-batching ONNX Runtime server, 32 rows / 1 ms
  (`bench.serve.ort_batch_server`);
* `onnx_batching`, `onnx`, `saved_model_batching`: tfship (batching max 32, 1 ms, 1 batch thread);
* `identity_tensor_content`, `onnx_batching_tensor_content`: the same with `--enable_serialization_as_tensor_content`
  (answers as raw bytes instead of TF Serving's default typed fields: the cost of each encoding);
* REST `:predict` JSON, row (`instances`) and columnar (`inputs`), against a bare aiohttp server
  (`bench.serve.bare_rest`) answering with tfship's prebuilt reply, and against a hand-written aiohttp + orjson +
  ONNX Runtime server that parses every body and runs the model per request (`bench.serve.ort_rest`).

Each round also measures the in-process limit (ONNX Runtime, one thread, batch 1 and 32). After the
rounds: `--num-processes 2` against one process (nothing pinned), the mixed load (`bench.serve.mixed_load`:
each protocol's throughput and p99 alone and beside another), and, with `--profile-s`, py-spy.
Report: `bench.serve.report` (medians of the rounds; JSON, Markdown, plot in `--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import host
from bench.serve import mixed_load, report
from bench.serve.endpoints import (
    THREAD_FLAGS,
    ReferenceEndpoint,
    TfshipEndpoint,
    child_env,
    grpc_reply,
    rest_bodies,
    rest_reply,
)
from bench.serve.models import ROOT, ModelInfo, load_infos, request_bytes

BATCHING = """max_batch_size { value: 32 }
batch_timeout_micros { value: 1000 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 1 }
"""
TENSOR_CONTENT = ("--enable_serialization_as_tensor_content",)
# (case, backend, batching, more flags). Answers fill the typed fields (TF Serving's default) unless the case
# passes TENSOR_CONTENT; the `*_tensor_content` cases measure what the typed default costs.
TFSHIP_CASES = (("identity", "identity", False, ()), ("identity_tensor_content", "identity", False, TENSOR_CONTENT),
                ("onnx_batching", "onnx", True, ()), ("onnx_batching_tensor_content", "onnx", True, TENSOR_CONTENT),
                ("onnx", "onnx", False, ()), ("saved_model_batching", "saved_model", True, ()))


@dataclass(frozen=True)
class Plan:
    """What to run. Times in seconds; `levels`: concurrency levels; `repeats`: alternating rounds."""

    work: Path
    out: Path
    warmup_s: float
    window_s: float
    levels: tuple[int, ...]
    repeats: int
    models: tuple[str, ...]
    multiprocess: bool
    rest: bool
    profile_s: float
    quick: bool
    profile_name: str = "serve-profile.md"  # the profile's file under `out`
    profile_only: bool = False  # build the models, profile, write nothing else (issue 43's before/after)


def cores() -> tuple[int, int]:
    """(server core, load generator core); both the same on a one-core machine."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) > 1 else (cpus[0], cpus[0])


def loadgen(plan: Plan, endpoint, request_file: Path, *, rest_url: str | None = None, levels=None,
            cpu: int | None = None, channels: int = 1) -> list[dict]:
    """Run `bench.serve.loadgen` against `endpoint` in its own process; returns its per-level dicts."""
    levels = levels or plan.levels
    cmd = [sys.executable, "-m", "bench.serve.loadgen", "--request-file", str(request_file),
           "--concurrency", ",".join(map(str, levels)), "--warmup-s", str(plan.warmup_s),
           "--window-s", str(plan.window_s), "--channels", str(channels),
           *(f"--server-pid={p}" for p in endpoint.pids), *(f"--metrics-url={u}" for u in endpoint.metrics_urls)]
    cmd += ["--rest-url", rest_url] if rest_url else ["--target", endpoint.grpc_target]
    if cpu is not None:
        cmd.append(f"--cpu={cpu}")
    budget = 60 + len(levels) * (plan.warmup_s + plan.window_s) * 2
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=child_env(), timeout=budget)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def inprocess(plan: Plan, info: ModelInfo, backend: str = "onnx") -> list[dict]:
    """The in-process limit of `backend` on `info` (batch 1 and 32, one thread, server core)."""
    cmd = [sys.executable, "-m", "bench.serve.inprocess", "--version-dir", str(plan.work / "repo" / info.name / "1"),
           "--backend", backend, "--alias", info.input_alias, "--shape", ",".join(map(str, info.input_shape)),
           "--batch", "1,32", "--warmup-s", str(plan.warmup_s), "--window-s", str(plan.window_s),
           f"--cpu={cores()[0]}", *THREAD_FLAGS]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=child_env(), timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"inprocess {info.name}/{backend} failed: {done.stderr[-2000:]}")
    return [{"mode": "inprocess", "model": info.name, "backend": backend, **r}
            for r in json.loads(done.stdout.strip().splitlines()[-1])]


def handler_cost(plan: Plan, info: ModelInfo, evict_mib: int = 0) -> dict | None:
    """`bench.serve.handler_cost` on the identity version of `info`, pinned to the server core, with warm
    caches (`evict_mib` 0) or with that many MiB written between calls; None on failure.
    """
    cmd = [sys.executable, "-m", "bench.serve.handler_cost", "--repo", str(plan.work / "repo"), "--model",
           f"identity_{info.name}", "--request-file", str(plan.work / f"request_identity_{info.name}.bin"),
           f"--cpu={cores()[0]}", f"--evict-mib={evict_mib}", *(("--calls", "1000") if evict_mib else ())]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=child_env(), timeout=300)
    if done.returncode != 0:
        print(f"[bench-serve] handler_cost failed: {done.stderr[-600:]}", flush=True)
        return None
    return {"model": info.name, **json.loads(done.stdout.strip().splitlines()[-1])}


def _model_files(plan: Plan, info: ModelInfo) -> dict[str, Path]:
    """Request files of `info`: gRPC (model, identity) and REST bodies (row, columnar)."""
    import numpy as np

    files = {"grpc": plan.work / f"request_{info.name}.bin", "identity": plan.work / f"request_identity_{info.name}.bin"}
    files["grpc"].write_bytes(request_bytes(info.name, info.input_alias, info.input_shape))
    files["identity"].write_bytes(request_bytes(f"identity_{info.name}", info.input_alias, info.input_shape))
    row = np.random.default_rng(0).random(info.input_shape, dtype=np.float32).tolist()
    for fmt, body in rest_bodies(info.input_alias, row).items():
        files[f"rest_{fmt}"] = plan.work / f"request_{info.name}_{fmt}.json"
        files[f"rest_{fmt}"].write_bytes(body)
    return files


def model_rounds(plan: Plan, info: ModelInfo) -> list[dict]:
    """Start every server for `info`, then `plan.repeats` alternating rounds over them; tagged rows."""
    server_cpu, loadgen_cpu = cores()
    files, repo, batching = _model_files(plan, info), plan.work / "repo", plan.work / "batching.txt"
    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        grpc_cases = {}
        for case, backend, batched, flags in TFSHIP_CASES:
            name = f"identity_{info.name}" if backend == "identity" else info.name
            endpoint = TfshipEndpoint(repo, name, backend, batching if batched else None, server_cpu, flags)
            grpc_cases[case] = (stack.enter_context(endpoint), files["identity" if backend == "identity" else "grpc"])
        reply = plan.work / f"reply_identity_{info.name}.bin"
        reply.write_bytes(grpc_reply(grpc_cases["identity"][0].grpc_target, files["identity"].read_bytes()))
        grpc_cases["bare"] = (stack.enter_context(ReferenceEndpoint("bare_server", ["--response-file", str(reply)],
                                                                    server_cpu)), files["identity"])
        # the least a Python handler that parses the request does (parse, view, echo): the floor under `identity`
        grpc_cases["echo"] = (stack.enter_context(ReferenceEndpoint("echo_server", ["--response-file", str(reply)],
                                                                    server_cpu)), files["identity"])
        onnx_file = repo / info.name / "1" / "model.onnx"
        grpc_cases["ort"] = (stack.enter_context(ReferenceEndpoint("ort_server", ["--model", str(onnx_file)],
                                                                   server_cpu)), files["grpc"])
        grpc_cases["ort_batching"] = (stack.enter_context(ReferenceEndpoint(
            "ort_batch_server", ["--model", str(onnx_file)], server_cpu)), files["grpc"])
        rest_cases = {}
        if plan.rest:
            tfship = grpc_cases["onnx_batching"][0]
            rest_cases = {f"rest_{fmt}": (tfship, files[f"rest_{fmt}"], tfship.rest_url()) for fmt in ("row", "columnar")}
            body = plan.work / f"reply_rest_{info.name}.json"
            body.write_bytes(rest_reply(tfship.rest_url(), files["rest_row"].read_bytes()))
            bare = stack.enter_context(ReferenceEndpoint("bare_rest", ["--response-file", str(body)], server_cpu))
            rest_cases["rest_bare"] = (bare, files["rest_row"], bare.rest_url(info.name))
            hand = stack.enter_context(ReferenceEndpoint("ort_rest", ["--model", str(onnx_file)], server_cpu))
            rest_cases["rest_ort"] = (hand, files["rest_row"], hand.rest_url(info.name))
        for repeat in range(plan.repeats):
            print(f"[bench-serve] {info.name} round {repeat + 1}/{plan.repeats}", flush=True)
            rows += [{**r, "repeat": repeat} for r in inprocess(plan, info)]
            for case, (endpoint, request) in grpc_cases.items():
                rows += [{"mode": "grpc", "model": info.name, "case": case, "repeat": repeat, **r}
                         for r in loadgen(plan, endpoint, request, cpu=loadgen_cpu)]
            for case, (endpoint, request, url) in rest_cases.items():
                rows += [{"mode": "rest", "model": info.name, "case": case, "repeat": repeat, **r}
                         for r in loadgen(plan, endpoint, request, rest_url=url, cpu=loadgen_cpu)]
    return rows


def multiprocess(plan: Plan, info: ModelInfo) -> list[dict]:
    """tfship onnx batching as one process and as `--num-processes 2` (SO_REUSEPORT), nothing pinned, 8
    connections. A failure is recorded, not raised."""
    files, rows = _model_files(plan, info), []
    for processes in (1, 2):
        extra = ("--num-processes", str(processes)) if processes > 1 else ()
        tag = {"mode": "multiprocess", "model": info.name, "case": "onnx_batching", "processes": processes}
        try:
            with TfshipEndpoint(plan.work / "repo", info.name, "onnx", plan.work / "batching.txt", None, extra) as ep:
                rows += [{**tag, **r} for r in loadgen(plan, ep, files["grpc"], levels=(32, 64), channels=8)]
        except (RuntimeError, OSError, subprocess.TimeoutExpired, Exception) as err:  # noqa: BLE001 - recorded
            rows.append({**tag, "error": f"{type(err).__name__}: {str(err)[-600:]}"})
    return rows


def prepare(plan: Plan) -> list[ModelInfo]:
    """Build the model repository (child process: TensorFlow stays out of this one)."""
    subprocess.run([sys.executable, "-m", "bench.serve.models", "--work", str(plan.work)], check=True,
                   env=child_env(), stdout=subprocess.DEVNULL)
    (plan.work / "batching.txt").write_text(BATCHING)
    return [i for i in load_infos(plan.work) if i.name in plan.models]


def run(plan: Plan) -> dict:
    """Every case of `plan`; returns the result document (see `report.write`)."""
    infos = prepare(plan)
    started, uptime_before, rows = time.time(), host.uptime(), []
    for info in infos if not plan.profile_only else ():
        rows += model_rounds(plan, info)
    heavy = [i for i in infos if i.name == "mlp"]
    if plan.multiprocess and heavy and not plan.profile_only:
        print("[bench-serve] --num-processes 1 vs 2", flush=True)
        rows += multiprocess(plan, heavy[0])
    mixed = None
    if plan.rest and any(i.name == "digits" for i in infos) and not plan.profile_only:
        print("[bench-serve] mixed load: each protocol alone and together", flush=True)
        mixed = mixed_load.run(plan.work / "repo", list(mixed_load.PAIRS), window_s=1.5 if plan.quick else 3.0,
                               repeats=plan.repeats)
    cost = ({"warm": handler_cost(plan, heavy[0]), "cold": handler_cost(plan, heavy[0], evict_mib=64)}
            if heavy and not plan.profile_only else None)
    profile = None
    if plan.profile_s > 0 and heavy:
        from bench.serve.profile import profile_cases

        profile = profile_cases(plan, heavy[0], _model_files(plan, heavy[0]), loadgen, cores(), plan.profile_name,
                                25 if plan.profile_only else 15)
    return {"schema": "tfship.bench.serve/2", "started": started, "seconds": time.time() - started,
            "host": {**host.host_info(), "uptime_before": uptime_before, "uptime_after": host.uptime()},
            "plan": {k: str(v) if isinstance(v, Path) else v for k, v in vars(plan).items()},
            "batching_parameters": BATCHING, "server_flags": list(THREAD_FLAGS),
            "models": [vars(i) for i in infos], "rows": rows, "profile": profile, "handler_cost": cost,
            "mixed_load": mixed}


def parse(argv: list[str] | None = None) -> Plan:
    """Command line and environment -> `Plan`."""
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    p = argparse.ArgumentParser(prog="python -m bench.serve.run_bench", description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--quick", action="store_true", default=quick, help="short windows, one round (BENCH_QUICK=1)")
    p.add_argument("--warmup-s", type=float, default=float(os.environ.get("BENCH_WARMUP_S", "0")) or None)
    p.add_argument("--window-s", type=float, default=float(os.environ.get("BENCH_WINDOW_S", "0")) or None)
    p.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", "0")) or None)
    p.add_argument("--concurrency", default=os.environ.get("BENCH_CONCURRENCY", "1,8,32"))
    p.add_argument("--models", default=os.environ.get("BENCH_MODELS", "digits,mlp"))
    p.add_argument("--no-multiprocess", action="store_true")
    p.add_argument("--no-rest", action="store_true")
    p.add_argument("--profile-s", type=float, default=float(os.environ.get("BENCH_PROFILE_S", "0")),
                   help="seconds of py-spy per profiled case; 0 = no profile")
    p.add_argument("--profile-name", default="serve-profile.md", help="the profile's file name under --out")
    p.add_argument("--profile-only", action="store_true", help="only the profile (mlp): no rounds, no report")
    a = p.parse_args(argv)
    return Plan(work=a.work, out=a.out, warmup_s=a.warmup_s or (0.2 if a.quick else 0.7),
                window_s=a.window_s or (0.5 if a.quick else 2.0), levels=tuple(int(c) for c in a.concurrency.split(",")),
                repeats=a.repeats or (1 if a.quick else 3), models=tuple(a.models.split(",")),
                multiprocess=not a.no_multiprocess, rest=not a.no_rest, profile_s=a.profile_s, quick=a.quick,
                profile_name=a.profile_name, profile_only=a.profile_only)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, then write JSON, Markdown and the plot; prints the Markdown."""
    plan = parse(argv)
    plan.out.mkdir(parents=True, exist_ok=True)
    if plan.profile_only:
        plan = dataclasses.replace(plan, models=("mlp",), profile_s=plan.profile_s or 5.0)
        run(plan)
        print(plan.out / plan.profile_name)
        return 0
    paths = report.write(run(plan), plan.out)
    print(paths[2].read_text())
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
