"""`make bench-serve`: the serving benchmark, end to end.

For each model (digits CNN, 1024-wide MLP) and backend (saved_model, onnx, tflite), with batching
off and on: a `python -m serving` server pinned to core 0 and a load generator process
(`bench.serve.loadgen`) pinned to core 1 run batch-1 Predicts at each concurrency level. Two
references are measured in the same run: the in-process limit (`bench.serve.inprocess`, same
runtime, no RPC, batch 1 and 32, core 0) and the transport ceiling (`identity` backend, same
server). Then a multi-process mode (one server per core sharing the port via SO_REUSEPORT) and,
optionally, a py-spy profile of the server's per-request path.

Windows: `--warmup-s`/`--window-s` (env `BENCH_WARMUP_S`/`BENCH_WINDOW_S`); `--quick` (env
`BENCH_QUICK=1`) shortens them. Writes `<out>/serve-<timestamp>.json`, `serve-latest.json`,
`serve-latest.md`, `serve-latest.png` (and `serve-profile.md` with `--profile`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.serve import report
from bench.serve.models import ROOT, ModelInfo, load_infos, request_bytes
from core.errors import TfshipError

BACKENDS = ("saved_model", "onnx", "tflite")
# Servers start through this module: `python -m serving` with the benchmark-only `identity` backend registered.
SERVER_MODULE = "bench.serve.identity"
SERVER_CPU, LOADGEN_CPU = 0, 1
THREAD_FLAGS = ("--intra-op-threads", "1", "--inter-op-threads", "1")
BATCHING = """max_batch_size { value: 32 }
batch_timeout_micros { value: 2000 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 1 }
"""


@dataclass(frozen=True)
class Plan:
    """What to run. Times in seconds; `levels`: concurrency levels."""

    work: Path
    out: Path
    warmup_s: float
    window_s: float
    levels: tuple[int, ...]
    models: tuple[str, ...]
    backends: tuple[str, ...]
    multiprocess: bool
    profile_s: float
    quick: bool


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def _cores() -> tuple[int, int]:
    """(server core, load generator core); both 0 on a one-core machine."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) > 1 else (cpus[0], cpus[0])


@contextlib.contextmanager
def _pinned(cpus: set[int] | None):
    """Pin this process to `cpus` meanwhile, so children started inside inherit the affinity."""
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _server_args(batching_file: Path | None, port: int | None = None) -> list[str]:
    args = ["--rest-port", "-1", "--file-system-poll-wait-seconds", "0", *THREAD_FLAGS]
    if batching_file:
        args += ["--batching-parameters-file", str(batching_file)]
    if port is not None:
        args += ["--port", str(port)]
    return args


def run_loadgen(
    plan: Plan,
    target: str,
    request_file: Path,
    servers: list,
    levels=None,
    cpu: int | None = None,
    channels: int = 1,
) -> list[dict]:
    """Run `bench.serve.loadgen` in its own process; returns its per-level dicts."""
    cmd = [
        sys.executable,
        "-m",
        "bench.serve.loadgen",
        "--target",
        target,
        "--request-file",
        str(request_file),
        "--concurrency",
        ",".join(str(c) for c in (levels or plan.levels)),
        "--warmup-s",
        str(plan.warmup_s),
        "--window-s",
        str(plan.window_s),
        "--channels",
        str(channels),
        *(f"--server-pid={s.process.pid}" for s in servers),
        *(f"--metrics-url={s.metrics_url}" for s in servers if s.metrics_url),
    ]
    if cpu is not None:
        cmd.append(f"--cpu={cpu}")
    budget = 60 + len(levels or plan.levels) * (plan.warmup_s + plan.window_s) * 2
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env(), timeout=budget)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def serve_case(
    plan: Plan,
    model: str,
    backend: str,
    batching: bool,
    request_file: Path,
    rows: int = 1,
    profile_to: Path | None = None,
) -> list[dict]:
    """Start one pinned server, load it at every level; rows tagged with model/backend/batching."""
    from serving.launcher import ServerProcess

    server_cpu, loadgen_cpu = _cores()
    batching_file = plan.work / "batching.txt" if batching else None
    with _pinned({server_cpu}):
        server = ServerProcess(plan.work / "repo", model, backend, _server_args(batching_file), env=_env(),
                               module=SERVER_MODULE)
        server.__enter__()
    try:
        profiler = _start_profiler(server.process.pid, profile_to, plan) if profile_to else None
        rows_out = run_loadgen(plan, server.grpc_target, request_file, [server], cpu=loadgen_cpu)
        if profiler:
            profiler.wait(timeout=plan.profile_s + 60)
    finally:
        server.__exit__(None, None, None)
    tag = {"mode": "server", "model": model, "backend": backend, "batching": batching}
    return [{**tag, **r} for r in rows_out]


def _start_profiler(pid: int, out: Path, plan: Plan) -> subprocess.Popen:
    """py-spy record of `pid` in raw (collapsed-stack) format, starting after the first warm-up."""
    py_spy = Path(sys.executable).with_name("py-spy")
    time.sleep(plan.warmup_s + 0.5)  # loadgen process start + warm-up: profile the steady state
    return subprocess.Popen(
        [
            str(py_spy),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(plan.profile_s)),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def inprocess_case(plan: Plan, info: ModelInfo, backend: str) -> list[dict]:
    """The in-process limit of `backend` on `info` (batch 1 and 32, pinned to the server core)."""
    cmd = [
        sys.executable,
        "-m",
        "bench.serve.inprocess",
        "--version-dir",
        str(plan.work / "repo" / info.name / "1"),
        "--backend",
        backend,
        "--alias",
        info.input_alias,
        "--shape",
        ",".join(map(str, info.input_shape)),
        "--batch",
        "1,32",
        "--warmup-s",
        str(plan.warmup_s),
        "--window-s",
        str(plan.window_s),
        f"--cpu={_cores()[0]}",
        *THREAD_FLAGS,
    ]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env(), timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"inprocess {info.name}/{backend} failed: {done.stderr[-2000:]}")
    return [
        {"mode": "inprocess", "model": info.name, "backend": backend, **r}
        for r in json.loads(done.stdout.strip().splitlines()[-1])
    ]


def multiprocess_case(plan: Plan, model: str, backend: str, request_file: Path) -> list[dict]:
    """`serve --num-processes <cores>`: worker processes sharing one port (SO_REUSEPORT), load from many
    connections; nothing pinned (the load generator shares the cores). A failure is recorded, not raised."""
    from serving.launcher import ServerProcess

    cores = len(os.sched_getaffinity(0))
    tag = {"mode": "multiprocess", "model": model, "backend": backend, "batching": True, "servers": cores}
    args = [*_server_args(plan.work / "batching.txt"), "--num-processes", str(cores)]
    try:
        with ServerProcess(plan.work / "repo", model, backend, args, env=_env(), module=SERVER_MODULE) as server:
            workers = [_Worker(w["pid"], f"http://127.0.0.1:{w['metrics']}") for w in server.ports["workers"]]
            rows = run_loadgen(plan, server.grpc_target, request_file, workers, levels=(32, 64), channels=8)
        return [{**tag, **r} for r in rows]
    except (TfshipError, RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        return [{**tag, "error": f"{type(err).__name__}: {str(err)[-600:]}"}]


@dataclass(frozen=True)
class _Worker:
    """What `run_loadgen` reads of a server: its pid (CPU time) and metrics URL (batch sizes)."""

    pid: int
    metrics_url: str

    @property
    def process(self) -> _Worker:
        return self


def prepare(plan: Plan) -> list[ModelInfo]:
    """Build the model repository (child process: TensorFlow stays out of this one) and the request files."""
    subprocess.run(
        [sys.executable, "-m", "bench.serve.models", "--work", str(plan.work)],
        check=True,
        env=_env(),
        stdout=subprocess.DEVNULL,
    )
    (plan.work / "batching.txt").write_text(BATCHING)
    infos = [i for i in load_infos(plan.work) if i.name in plan.models]
    for info in infos:
        for name in (info.name, f"identity_{info.name}"):
            (plan.work / f"request_{name}.bin").write_bytes(
                request_bytes(name, info.input_alias, info.input_shape)
            )
    return infos


def run(plan: Plan) -> dict:
    """Every case of `plan`; returns the result document (see `report.write`)."""
    infos = prepare(plan)
    started, rows = time.time(), []
    for info in infos:
        request = plan.work / f"request_{info.name}.bin"
        for backend in plan.backends:
            rows += inprocess_case(plan, info, backend)
            for batching in (False, True):
                print(
                    f"[bench-serve] {info.name} {backend} batching={'on' if batching else 'off'}", flush=True
                )
                rows += serve_case(plan, info.name, backend, batching, request)
        for batching in (False, True):
            rows += [
                {**r, "model": info.name, "mode": "identity"}
                for r in serve_case(
                    plan,
                    f"identity_{info.name}",
                    "identity",
                    batching,
                    plan.work / f"request_identity_{info.name}.bin",
                )
            ]
    if plan.multiprocess and "mlp" in plan.models:
        print("[bench-serve] multi-process (SO_REUSEPORT)", flush=True)
        rows += multiprocess_case(plan, "mlp", "onnx", plan.work / "request_mlp.bin")
    profile = None
    if plan.profile_s > 0:
        profile = profile_cases(plan)
    return {
        "schema": "tfship.bench.serve/1",
        "started": started,
        "seconds": time.time() - started,
        "host": report.host_info(),
        "plan": {k: str(v) if isinstance(v, Path) else v for k, v in vars(plan).items()},
        "batching_parameters": BATCHING,
        "server_flags": list(THREAD_FLAGS),
        "models": [vars(i) for i in infos],
        "rows": rows,
        "profile": profile,
    }


def profile_cases(plan: Plan) -> dict:
    """py-spy the server under concurrency 32: identity (pure per-request path) and mlp/onnx batched."""
    from bench.serve import profile

    cases = {}
    for name, model, backend, batching in (
        ("identity_mlp", "identity_mlp", "identity", False),
        ("mlp_onnx_batched", "mlp", "onnx", True),
    ):
        raw = plan.work / f"profile_{name}.txt"
        raw.unlink(missing_ok=True)
        longer = Plan(**{**vars(plan), "levels": (32,), "window_s": plan.profile_s + 2})
        rows = serve_case(
            longer, model, backend, batching, plan.work / f"request_{model}.bin", profile_to=raw
        )
        cases[name] = {"rows": rows, "top": profile.summarise(raw) if raw.exists() else None}
    path = plan.out / "serve-profile.md"
    kept = path.read_text().split(profile.GENERATED)[0] if path.exists() else ""  # hand-written findings
    path.write_text(kept + profile.GENERATED + "\n" + profile.markdown(cases))
    return cases


def parse(argv: list[str] | None = None) -> Plan:
    """Command line and environment -> `Plan`."""
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    p = argparse.ArgumentParser(prog="python -m bench.serve.run_bench", description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--quick", action="store_true", default=quick, help="short windows (env BENCH_QUICK=1)")
    p.add_argument("--warmup-s", type=float, default=float(os.environ.get("BENCH_WARMUP_S", "0")) or None)
    p.add_argument("--window-s", type=float, default=float(os.environ.get("BENCH_WINDOW_S", "0")) or None)
    p.add_argument("--concurrency", default=os.environ.get("BENCH_CONCURRENCY", "1,8,32,64"))
    p.add_argument("--models", default=os.environ.get("BENCH_MODELS", "digits,mlp"))
    p.add_argument("--backends", default=os.environ.get("BENCH_BACKENDS", ",".join(BACKENDS)))
    p.add_argument("--no-multiprocess", action="store_true")
    p.add_argument(
        "--profile-s",
        type=float,
        default=float(os.environ.get("BENCH_PROFILE_S", "0")),
        help="seconds of py-spy per profiled case; 0 = no profile",
    )
    a = p.parse_args(argv)
    return Plan(
        work=a.work,
        out=a.out,
        warmup_s=a.warmup_s or (0.2 if a.quick else 1.0),
        window_s=a.window_s or (0.5 if a.quick else 3.0),
        levels=tuple(int(c) for c in a.concurrency.split(",")),
        models=tuple(a.models.split(",")),
        backends=tuple(a.backends.split(",")),
        multiprocess=not a.no_multiprocess,
        profile_s=a.profile_s,
        quick=a.quick,
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, then write JSON, Markdown and the plot; prints the Markdown path."""
    plan = parse(argv)
    plan.out.mkdir(parents=True, exist_ok=True)
    doc = run(plan)
    paths = report.write(doc, plan.out)
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
