"""`make bench-pipeline`: time and peak memory of every pipeline stage for models of ~1, 30 and 300 MB.

For each size a wide MLP is built here (`bench.pipeline.models`, no downloads), then every stage runs
alone in its own child process (`bench.pipeline.stage`) while this process samples the resident
memory of that child and all its descendants (`bench.memory`, converters' own child
processes included): export (+ audit and behaviour checks), the audit alone, each conversion (ONNX,
TFLite float32 / float16 / dynamic_range / int8), the whole convert stage with its conversions side by
side, validate, serve-check, publish. Then the published version is served by each backend: load
time (process start to grpc health SERVING), first-request latency and server RSS, less the RSS of the
same server serving the `identity` backend (RSS per loaded version).

Writes `<out>/pipeline-latest.{json,md,png}` and `pipeline-<timestamp>.json`. `--sizes 1,30` (env
`BENCH_SIZES`) picks the sizes in MB (or `resnet50`); `--stages export,convert` (env `BENCH_STAGES`) the stages;
`--quick` (env `BENCH_QUICK=1`) runs 1 MB only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from bench.memory import rss_bytes, run_sampled
from bench.pipeline import report
from bench.pipeline.main_job import run_main_job

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("export", "audit", "onnx", "tflite_float32", "tflite_float16", "tflite_dynamic_range", "tflite_int8",
          "convert", "validate", "serve_check", "publish")
BACKENDS = ("saved_model", "onnx", "tflite")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def measured(cmd: list[str], timeout_s: float) -> dict:
    """Run `cmd`, sampling its process tree's RSS; returns wall seconds, peak RSS bytes, exit code, RESULT."""
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-pipeline-{os.getpid()}.log"
    done = run_sampled(cmd, timeout_s, log, env=_env())
    result = next((json.loads(line[7:]) for line in done.output.splitlines() if line.startswith("RESULT ")), None)
    return {"wall_s": done.seconds, "peak_rss": done.peak_rss_bytes, "returncode": done.returncode,
            "result": result, "tail": "" if done.returncode == 0 else done.tail(12)}


def run_size(size_mb: float | str, work: Path, timeout_s: float, skip: dict[str, str],
             stages: tuple[str, ...] = STAGES) -> dict:
    """Build the `size_mb` model (or the zoo architecture so named), run every stage and the server checks;
    returns its record."""
    folder = work / (f"{size_mb:g}mb" if isinstance(size_mb, float) else size_mb)
    shutil.rmtree(folder, ignore_errors=True)
    built = measured([sys.executable, "-m", "bench.pipeline.models", str(size_mb), str(folder)], timeout_s)
    record = {"size_mb": size_mb, "build": built, "stages": {}, "serve": {}, "skipped": {}}
    if built["returncode"] != 0:
        record["error"] = f"model build failed: {built['tail']}"
        return record
    record["model"] = {**(built["result"] or {}), **_model_info(folder)}
    base = [sys.executable, "-m", "bench.pipeline.stage", "--run", str(folder / "run"), "--model",
            str(folder / "model.keras"), "--data", str(folder / "data.npz"), "--repository", str(folder / "repo"),
            "--timeout-s", str(timeout_s)]
    for stage in stages:
        if stage in skip:
            record["skipped"][stage] = skip[stage]
            continue
        print(f"[bench-pipeline] {_label(size_mb)}: {stage}", flush=True)
        record["stages"][stage] = measured([*base[:3], stage, *base[3:]], timeout_s * 2 + 120)
        if record["stages"][stage]["returncode"] != 0 and stage in ("export", "validate", "serve_check"):
            record["error"] = f"{stage} failed: {record['stages'][stage]['tail']}"
            return record
    published = folder / "repo" / "wide"
    if published.is_dir() and isinstance(size_mb, float):  # the served checks feed the MLP's `x` [1, 784]
        record["serve"] = serve_checks(folder / "repo", work)
    return record


def _label(size: float | str) -> str:
    return f"{size:g} MB" if isinstance(size, float) else size


def _size(token: str) -> float | str:
    """A size in MB, or a zoo architecture's name (`resnet50`)."""
    try:
        return float(token)
    except ValueError:
        return token.strip().lower()


def _model_info(folder: Path) -> dict:
    import numpy as np

    keras_bytes = (folder / "model.keras").stat().st_size
    with np.load(folder / "data.npz") as data:
        rows = int(data[data.files[0]].shape[0])
    return {"keras_file_bytes": keras_bytes, "rows": rows}


def serve_checks(repository: Path, work: Path) -> dict:
    """Per backend: seconds to SERVING, first Predict latency (ms), server RSS, RSS over the identity server."""
    from tfship.serving.launcher import ServerProcess

    identity = work / "identity_repo" / "wide" / "1"
    identity.mkdir(parents=True, exist_ok=True)
    (identity / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None, 784]}}}))
    out = {}
    for backend in ("identity", *BACKENDS):
        repo = work / "identity_repo" if backend == "identity" else repository
        started = time.perf_counter()
        try:
            with ServerProcess(repo, "wide", backend, ["--rest-port", "-1"], env=_env(), startup_timeout_s=600,
                               module="bench.serve.identity") as server:  # serving + the benchmark's identity
                load_s = time.perf_counter() - started
                first_ms = _first_request_ms(server.grpc_target)
                out[backend] = {"load_s": load_s, "first_request_ms": first_ms, "rss": rss_bytes(server.process.pid)}
        except Exception as err:  # noqa: BLE001 - recorded in the report
            out[backend] = {"error": f"{type(err).__name__}: {str(err)[-500:]}"}
    base = out.get("identity", {}).get("rss")
    for backend in BACKENDS:
        if base and "rss" in out[backend]:
            out[backend]["rss_over_identity"] = out[backend]["rss"] - base
    return out


def _first_request_ms(target: str) -> float:
    import numpy as np

    from tfship.serving.tfs.client import PredictClient

    x = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    with PredictClient(target, timeout_s=120) as client:
        started = time.perf_counter()
        client.predict("wide", {"x": x})
        return (time.perf_counter() - started) * 1e3


def parse(argv=None) -> argparse.Namespace:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    p = argparse.ArgumentParser(prog="python -m bench.pipeline.run_bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=os.environ.get("BENCH_SIZES") or ("1" if quick else "1,30,300,resnet50"),
                   help="weight sizes in MB, or zoo architectures by name (resnet50), comma-separated")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "pipeline")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--stages", default=os.environ.get("BENCH_STAGES") or ",".join(STAGES),
                   help=f"comma-separated stages to run, in order (default: all): {', '.join(STAGES)}")
    p.add_argument("--no-main-job", dest="main_job", action="store_false",
                   help="skip the main job (`tfship run` on digits, timed by stage; bench.pipeline.main_job)")
    p.add_argument("--timeout-s", type=float, default=float(os.environ.get("BENCH_STAGE_TIMEOUT_S", "600")),
                   help="per-conversion time limit (the pipeline's convert.timeout_seconds)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """CLI entry point: run every size, write JSON, Markdown and the plot; print the Markdown."""
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started, before, sizes = time.time(), report.uptime(), [_size(s) for s in args.sizes.split(",")]
    records = []
    main_job = run_main_job(ROOT, args.work / "main_job", _env(), report.uptime) if args.main_job else None
    for size in sizes:
        # A zoo architecture is there for its convert stage (every conversion side by side, within the memory
        # budget); each conversion's own peak is in that stage's memory plan, so they are not run alone too.
        skip = {} if isinstance(size, float) else {
            name: "measured inside the convert stage (its memory plan lists each conversion's peak)"
            for name in STAGES if name.startswith(("onnx", "tflite_"))}
        records.append(run_size(size, args.work, args.timeout_s, skip,
                                tuple(s for s in STAGES if s in args.stages.split(","))))
        doc = {"schema": "tfship.bench.pipeline/1", "started": started, "seconds": time.time() - started,
               "host": {**report.host_info(), "uptime_before": before, "uptime_after": report.uptime()},
               "records": records, "main_job": main_job}
        paths = report.write(doc, args.out)  # after every size: an interrupted run keeps what it measured
    print(paths[2].read_text())
    print("\n".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
