"""The parts of `make gpu-check`. Each takes the shared `Context` and returns a `PartResult`; a part that needs
what the machine lacks (a GPU, a Docker GPU runtime, enough cores) is skipped with that reason, and a part that
raises is recorded as failed with the error's first line. Servers are real tfship servers on loopback
(`bench.serve.endpoints`), load comes from `bench.serve.loadgen` in its own processes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.gpu_check import probe
from bench.gpu_check.report import PartResult, PartStatus
from bench.serve.endpoints import THREAD_FLAGS, TfshipEndpoint, child_env

ROOT = Path(__file__).resolve().parents[2]
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
LEVELS = (1, 8, 32)
SCALING_PROCESSES = (1, 2, 4, 8)


@dataclass
class Context:
    """What every part shares: folders, the GPUs found, the time budget and the quick switch."""

    work: Path
    gpus: list[probe.Gpu]
    deadline: float
    quick: bool = False
    cores: list[int] = field(default_factory=lambda: sorted(os.sched_getaffinity(0)))

    @property
    def warmup_s(self) -> float:
        return 0.5 if self.quick else 1.0

    @property
    def window_s(self) -> float:
        return 1.0 if self.quick else 3.0

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()


class Skip(Exception):
    """Raised by a part that cannot run here; the message is the reason shown."""


def run_part(name: str, part: Callable[[Context], PartResult], ctx: Context) -> PartResult:
    """Run one part, timing it; a `Skip` becomes a skipped part and any other error a failed one."""
    started = time.monotonic()
    if ctx.seconds_left() <= 0:
        return PartResult(name, PartStatus.SKIPPED, "the check's time budget was spent before this part")
    try:
        result = part(ctx)
    except Skip as why:
        result = PartResult(name, PartStatus.SKIPPED, str(why))
    except Exception as err:  # noqa: BLE001 - a failed part is recorded and the check goes on
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        result = PartResult(name, PartStatus.FAILED, f"{type(err).__name__}: {first}")
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _need_gpu(ctx: Context, what: str) -> None:
    if not ctx.gpus:
        raise Skip(f"no NVIDIA GPU (nvidia-smi lists none): {what} needs one")


def _need_tensorflow(what: str) -> None:
    """Skip when TensorFlow is not importable (a machine image without it: the TF-free parts still run)."""
    if importlib.util.find_spec("tensorflow") is None:
        raise Skip(f"TensorFlow is not installed in this Python ({sys.executable}): {what} needs it")


def _gpu_backends() -> tuple[list[str], list[str]]:
    """(backends that can serve on this machine's GPU, why each other one cannot): `saved_model` needs
    TensorFlow, `onnx` needs ONNX Runtime's CUDAExecutionProvider (the `onnxruntime-gpu` wheel)."""
    usable, why_not = [], []
    if importlib.util.find_spec("tensorflow") is None:
        why_not.append("saved_model: TensorFlow is not installed")
    else:
        usable.append("saved_model")
    if "CUDAExecutionProvider" in probe.onnx_providers():
        usable.append("onnx")
    else:
        why_not.append(f"onnx: ONNX Runtime offers no CUDAExecutionProvider ({', '.join(probe.onnx_providers())})")
    return usable, why_not


def _python(args: list[str], env: dict | None = None, timeout_s: float = 300.0) -> str:
    done = subprocess.run([sys.executable, *args], check=False, capture_output=True, text=True, cwd=ROOT,
                          env={**child_env(), **(env or {})}, timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise RuntimeError(f"{' '.join(args[:3])} exited {done.returncode}: {tail}")
    return done.stdout


# ---------------------------------------------------------------- training
def training(ctx: Context) -> PartResult:
    """The digits CNN's XLA train step on GPU (float32, mixed_float16 with loss scaling, mixed_bfloat16) against
    the same step on CPU in this run (`publish` then proves each precision still publishes float32)."""
    _need_tensorflow("the training step")
    steps = ["--warmup", "2", "--windows", "2", "--window-steps", "10"] if ctx.quick else []
    devices = (["gpu"] if ctx.gpus else []) + ["cpu"]
    cpu_precisions = ("float32",) if ctx.quick else PRECISIONS
    rows, cpu_rate = [], {}  # CPU first: each GPU row carries its ratio to the same step on CPU
    for device in ("cpu", *[d for d in devices if d != "cpu"]):
        for precision in PRECISIONS if device == "gpu" else cpu_precisions:
            env = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
            case = json.loads(_python(["-m", "bench.gpu_check.train_case", "--precision", precision, *steps], env)
                              .strip().splitlines()[-1])
            if device == "cpu":
                cpu_rate[precision] = case["steps_per_s"]
            row = {"device": device, "precision": precision, "steps_per_s": case["steps_per_s"],
                   "placed_on": case["device"]}
            if device == "gpu" and cpu_rate.get(precision):
                row["gpu_over_cpu"] = round(case["steps_per_s"] / cpu_rate[precision], 2)
            rows.append(row)
    return PartResult("training", PartStatus.RAN, "" if ctx.gpus else "GPU rows skipped: no NVIDIA GPU", rows=rows)


def publish(ctx: Context) -> PartResult:
    """`tfship run` on GPU per precision: each must publish a float32 SavedModel that passed the gate."""
    _need_gpu(ctx, "publishing from GPU training")
    _need_tensorflow("publishing")
    rows = []
    for precision in PRECISIONS[:1] if ctx.quick else PRECISIONS:
        started = time.monotonic()
        rows.append({"precision": precision, "published": _publish(ctx, precision),
                     "seconds": round(time.monotonic() - started, 1)})
    return PartResult("publish", PartStatus.RAN, rows=rows)


def _publish(ctx: Context, precision: str) -> str:
    """`tfship run` with `precision` on GPU; 'yes: <version folder>' when a float32 SavedModel was published."""
    repo = ctx.work / f"publish-{precision}"
    _python(["-m", "tfship.pipeline.cli", "run", "--epochs", "2", "--set", f"train.mixed_precision={precision}",
             "--repository", str(repo), "--runs-dir", str(ctx.work / "runs")], timeout_s=600)
    from tfship.core.saved_model import read_signatures

    versions = sorted((repo / "digits").glob("[0-9]*"), key=lambda p: int(p.name))
    if not versions:
        raise RuntimeError(f"tfship run with {precision} published nothing under {repo}")
    signature = read_signatures(versions[-1])["serving_default"]
    dtypes = {name: spec.dtype for name, spec in {**signature.inputs, **signature.outputs}.items()}
    floats = {name: dtype for name, dtype in dtypes.items() if "float" in dtype}
    if any(dtype != "float32" for dtype in floats.values()):
        raise RuntimeError(f"{precision}: published signature is not float32: {floats}")
    return f"yes: {versions[-1]} (float signature dtypes {sorted(set(floats.values()))})"


# ---------------------------------------------------------------- serving
def _models(ctx: Context, with_resnet: bool) -> dict[str, tuple]:
    """{name: (ModelInfo-like alias, shape)} built under ctx.work/repo: the heavy MLP and a ResNet50-class CNN."""
    from bench.serve.models import build_mlp

    repo = ctx.work / "repo"
    if importlib.util.find_spec("tensorflow") is None:  # a TF-free image: the ONNX file built elsewhere
        onnx = repo / "mlp" / "1" / "model.onnx"
        if with_resnet or not onnx.is_file():
            raise Skip(f"TensorFlow is not installed and {onnx} is not there: build it on a TensorFlow machine "
                       "with `python -m bench.gpu_check.prebuild --work DIR`, then pass --work DIR")
        return {"mlp": ("x", (784,))}
    info = build_mlp(repo / "mlp" / "1")
    models = {"mlp": (info.input_alias, info.input_shape)}
    if with_resnet:
        models["resnet50"] = _build_resnet(repo / "resnet50" / "1")
    return models


def _build_resnet(version_dir: Path) -> tuple[str, tuple[int, ...]]:
    """keras.applications.ResNet50 (weights=None: random, no download) as SavedModel + ONNX."""
    shape = (224, 224, 3)
    if not (version_dir / "model.onnx").is_file():
        _python(["-m", "bench.gpu_check.build_resnet", "--version-dir", str(version_dir)], timeout_s=900)
    return "x", shape


def _request(ctx: Context, model: str, alias: str, shape: tuple[int, ...]) -> Path:
    from bench.serve.models import request_bytes

    path = ctx.work / f"request_{model}.bin"
    path.write_bytes(request_bytes(model, alias, shape))
    return path


def _loadgen(ctx: Context, target: str, request: Path, levels, cpu: int | None = None) -> list[dict]:
    args = ["-m", "bench.serve.loadgen", "--target", target, "--request-file", str(request),
            "--concurrency", ",".join(map(str, levels)), "--warmup-s", str(ctx.warmup_s),
            "--window-s", str(ctx.window_s)]
    if cpu is not None:
        args.append(f"--cpu={cpu}")
    return json.loads(_python(args, timeout_s=120 + len(levels) * 10 * (ctx.warmup_s + ctx.window_s)))


def _batching_file(ctx: Context) -> Path:
    path = ctx.work / "batching.txt"
    path.write_text("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 1000 }\n"
                    "num_batch_threads { value: 2 }\nmax_enqueued_batches { value: 1000 }\n")
    return path


def serving(ctx: Context) -> PartResult:
    """SavedModel on GPU and ONNX Runtime's CUDA provider, heavy MLP and ResNet50, c=1/8/32, batching on/off;
    the GPU memory each server holds (nvidia-smi) and the providers its session used, read back."""
    _need_gpu(ctx, "GPU serving")
    backends, why_not = _gpu_backends()
    if not backends:
        raise Skip("no backend can serve on this GPU: " + "; ".join(why_not))
    models = _models(ctx, with_resnet=not ctx.quick)
    facts = {"onnx providers read back": _providers_read_back(ctx.work / "repo" / "mlp" / "1"),
             "backends left out": "; ".join(why_not) or "none"}
    rows = []
    for model, (alias, shape) in models.items():
        request = _request(ctx, model, alias, shape)
        for backend in backends:
            for batched in (False, True):
                endpoint = TfshipEndpoint(ctx.work / "repo", model, backend,
                                          _batching_file(ctx) if batched else None, cpu=None)
                with endpoint:
                    memory = probe.gpu_memory_used_mib(endpoint.pids[0])
                    for level in _loadgen(ctx, endpoint.grpc_target, request, LEVELS):
                        rows.append({"model": model, "backend": backend, "batching": batched,
                                     "c": level["concurrency"], "inferences_per_s": level["inferences_per_s"],
                                     "p99_ms": level["latency_ms"]["p99"] if level.get("latency_ms") else None,
                                     "errors": level["errors"], "gpu_memory_mib": memory})
    return PartResult("serving", PartStatus.RAN, rows=rows, facts=facts)


def _providers_read_back(version_dir: Path) -> str:
    """The execution providers ONNX Runtime's session actually holds for `version_dir` with GPU allowed."""
    from tfship.serving.runtimes import REGISTRY, RuntimeOptions

    runtime = REGISTRY.create("onnx", version_dir, RuntimeOptions(use_gpu=True))
    runtime.load()
    try:
        return ", ".join(runtime.providers)
    finally:
        runtime.unload()


# ---------------------------------------------------------------- several models on one GPU
def multi_model(ctx: Context) -> PartResult:
    """Two models in one server under `--per_process_gpu_memory_fraction`; the memory the process holds must
    stay near the fraction, and a fraction too small for the model must fail the load with a clear error."""
    _need_gpu(ctx, "the GPU memory fraction")
    _need_tensorflow("the GPU memory fraction (the saved_model backend)")
    models = _models(ctx, with_resnet=not ctx.quick)
    config = ctx.work / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{m}" base_path: "{ctx.work / "repo" / m}" model_platform: "tensorflow" }}\n'
        for m in models) + "}\n")
    total = ctx.gpus[0].memory_total_mib
    rows = []
    for fraction in (0.2, 0.0002):
        from tfship.serving.launcher import ServerProcess

        args = ["--model_config_file", str(config), "--per_process_gpu_memory_fraction", str(fraction),
                *THREAD_FLAGS]
        row = {"fraction": fraction, "limit_mib": round(total * fraction)}
        try:
            with ServerProcess(ctx.work / "repo", next(iter(models)), "saved_model", args, env=child_env(),
                               startup_timeout_s=300) as server:
                row["gpu_memory_mib"] = probe.gpu_memory_used_mib(server.process.pid)
                row["outcome"] = "loaded both"
        except Exception as err:  # noqa: BLE001 - the refusal's text is the figure for the small fraction
            row["outcome"] = f"refused: {(str(err).strip().splitlines() or [''])[-1][:200]}"
        rows.append(row)
    return PartResult("multi_model", PartStatus.RAN, rows=rows, facts={"gpu_memory_total_mib": total})


# ---------------------------------------------------------------- the cloud image
def cloud_image(ctx: Context) -> PartResult:
    """The cloud image built and serving the heavy model with `docker run --gpus all`."""
    _need_gpu(ctx, "the cloud image on GPU")
    why = probe.docker_gpu_runtime()
    if why:
        raise Skip(why)
    _models(ctx, with_resnet=False)
    _python(["-m", "tfship.deploy", "build", "--target", "cloud"], timeout_s=1800)
    name = f"tfship-gpu-check-{os.getpid()}"
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "--gpus", "all", "--network", "host",
                    "-v", f"{ctx.work / 'repo'}:/models:ro", "-e", "MODEL_NAME=mlp", "-e", "GRPC_PORT=18500",
                    "-e", "REST_PORT=18501", "-e", "METRICS_PORT=19090", "tfship:cloud"], check=True,
                   capture_output=True, timeout=120)
    try:
        request = _request(ctx, "mlp", "x", (784,))
        deadline = time.monotonic() + 180
        while True:
            try:
                rows = _loadgen(ctx, "127.0.0.1:18500", request, (8,))
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(3)
    finally:
        subprocess.run(["docker", "rm", "-f", name], check=False, capture_output=True, timeout=60)
    return PartResult("cloud_image", PartStatus.RAN, rows=[{"c": r["concurrency"], "inferences_per_s":
                                                           r["inferences_per_s"], "errors": r["errors"]}
                                                          for r in rows])


# ---------------------------------------------------------------- scaling across cores
def scaling(ctx: Context) -> PartResult:
    """`--num-processes` 1/2/4/8 on CPU (heavy MLP, ONNX, one thread each) with the load generators pinned to
    other cores (one per two server processes): inferences/s and the efficiency of each added process."""
    rows, skipped = [], []
    runnable = [n for n in SCALING_PROCESSES if n + math.ceil(n / 2) <= len(ctx.cores)]
    if not runnable:
        raise Skip(f"{len(ctx.cores)} core(s): one server process and one load generator need 2")
    models = _models(ctx, with_resnet=False)
    alias, shape = models["mlp"]
    request = _request(ctx, "mlp", alias, shape)
    base = None
    for n in SCALING_PROCESSES:
        if n not in runnable:
            skipped.append(f"{n} processes need {n + math.ceil(n / 2)} cores")
            continue
        server_cores, loadgen_cores = ctx.cores[:n], ctx.cores[n:n + math.ceil(n / 2)]
        rate = _scaled_rate(ctx, n, server_cores, loadgen_cores, request)
        base = base or rate
        rows.append({"processes": n, "server_cores": len(server_cores), "loadgen_processes": len(loadgen_cores),
                     "inferences_per_s": round(rate, 1), "efficiency": round(rate / (n * base), 2)})
    reason = "; ".join(skipped) + (" (this machine has " + str(len(ctx.cores)) + " cores)" if skipped else "")
    return PartResult("scaling", PartStatus.RAN, reason, rows=rows)


def _scaled_rate(ctx: Context, n: int, server_cores: list[int], loadgen_cores: list[int], request: Path) -> float:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(server_cores))  # the server and its workers inherit the affinity
    try:
        endpoint = TfshipEndpoint(ctx.work / "repo", "mlp", "onnx", None, cpu=None,
                                  extra=("--num-processes", str(n)) if n > 1 else ())
        stack = contextlib.ExitStack()
        stack.enter_context(endpoint)
    finally:
        os.sched_setaffinity(0, before)
    with stack:
        args = ["--concurrency", str(16 * n // len(loadgen_cores) or 16), "--warmup-s", str(ctx.warmup_s),
                "--window-s", str(ctx.window_s), "--channels", "4"]
        procs = [subprocess.Popen([sys.executable, "-m", "bench.serve.loadgen", "--target", endpoint.grpc_target,
                                   "--request-file", str(request), *args, f"--cpu={cpu}"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT, env=child_env())
                 for cpu in loadgen_cores]
        total = 0.0
        for proc in procs:
            out, err = proc.communicate(timeout=120 + 10 * (ctx.warmup_s + ctx.window_s))
            if proc.returncode != 0:
                raise RuntimeError(f"loadgen exited {proc.returncode}: {err.strip().splitlines()[-1:]}")
            total += sum(level["inferences_per_s"] for level in json.loads(out))
    return total


def training_loop(ctx: Context) -> PartResult:
    """`tfship train` against a hand-written Keras fit on the GPU, with nvidia-smi's utilisation
    (bench/gpu_check/train_loop.py)."""
    _need_tensorflow("`tfship train`")
    from bench.gpu_check.train_loop import training_loop as run

    return run(ctx, _need_gpu, _python)


# In the order they run: the serving figures before the slower publish runs, the image build last.
PARTS: dict[str, Callable[[Context], PartResult]] = {
    "training": training, "training_loop": training_loop, "serving": serving, "multi_model": multi_model,
    "scaling": scaling, "publish": publish,
    "cloud_image": cloud_image,
}
