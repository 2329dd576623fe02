"""The runs of `make bench-train-loop` (`bench/train/loop_vs_fit.py`): one `tfship train` process (its config,
its figures from train.json, the scan's status, the precision its layers computed in), one hand-written Keras `fit`
reference process (`bench/train/loop_reference.py`), and the data they read.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

from bench.host import ROOT

WORK = ROOT / "bench" / "work" / "train-loop"
SCHEMA = "tfship.train-loop-bench/1"
TARGETS = {"mlp": 1.0, "end_to_end": 0.5}
MODES = (("eager", "float32"), ("tf.function", "float32"), ("xla", "float32"), ("eager", "mixed_bfloat16"),
         ("tf.function", "mixed_bfloat16"), ("xla", "mixed_bfloat16"))
QUICK_MODES = (("eager", "float32"), ("xla", "float32"), ("xla", "mixed_bfloat16"))
SMALL_TABLE = 50_000
REC_USERS, REC_ITEMS, REC_HISTORY = 50_000, 5_000, 20


def say(line: str) -> None:
    print(f"[bench-train-loop {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes
def run_process(command: list[str], log: Path, timeout_s: float) -> dict:
    """Run `command` (stdout+stderr into `log`); wall seconds, CPU seconds (user+sys of the process and its
    threads, from wait4) and the exit status. Raises RuntimeError naming the log's tail on a non-zero exit."""
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        timer = threading.Timer(timeout_s, process.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"{' '.join(command[:4])} ... exited {process.returncode} after {wall:.0f} s "
                           f"(log {log}):\n" + "\n".join(tail))
    return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "max_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def has_steps_per_execution() -> bool:
    from tfship.pipeline.config import TrainSection

    return "steps_per_execution" in TrainSection.model_fields


def _toml(value) -> str:
    if isinstance(value, dict):  # an inline table: {train = 900000, validation = 2000, test = 2000}
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def config_text(name: str, runs: Path, data: dict, feature_spec: dict, model: dict, train: dict) -> str:
    lines = ["[run]", f'model_name = "{name}"', f"runs_dir = {_toml(str(runs))}", "seed = 42", "", "[data]"]
    lines += [f"{k} = {_toml(v)}" for k, v in data.items()]
    for feature, spec in feature_spec.items():
        lines += ["", f"[data.feature_spec.{feature}]", *(f"{k} = {_toml(v)}" for k, v in spec.items())]
    lines += ["", "[model]", *(f"{k} = {_toml(v)}" for k, v in model.items())]
    lines += ["", "[train]", *(f"{k} = {_toml(v)}" for k, v in train.items())]
    return "\n".join(lines) + "\n"


def _find(tree, key: str):
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None


def layer_precisions(keras_file: Path) -> dict:
    """What the saved model's layers computed in (model.keras's config.json: each layer's dtype policy; a
    mixed_bfloat16 layer computes in bfloat16 and keeps float32 variables). Input layers are left out."""
    compute = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
    layers: dict[str, str] = {}

    def walk(node) -> None:
        if isinstance(node, dict):
            config = node.get("config")
            if node.get("class_name") not in (None, "InputLayer") and isinstance(config, dict):
                dtype = config.get("dtype")
                policy = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
                if isinstance(policy, str) and "name" in config:
                    layers[str(config["name"])] = compute.get(policy, policy)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    with zipfile.ZipFile(keras_file) as archive:
        walk(json.loads(archive.read("config.json")))
    by_dtype: dict[str, list[str]] = {}
    for name, dtype in layers.items():
        by_dtype.setdefault(dtype, []).append(name)
    low = [d for d in by_dtype if d in ("bfloat16", "float16")]
    text = "; ".join(f"{d}: {len(n)} layer(s)" + (f" ({', '.join(n)})" if len(n) <= 3 else "")
                     for d, n in sorted(by_dtype.items(), key=lambda item: -len(item[1])))
    return {"compute": low[0] if low else "float32", "layers_by_compute_dtype": by_dtype, "text": text}


def scan_status(train: dict, before: set[str], after: set[str], cache: Path) -> str:
    """Whether `tfship train`'s counted pass (pipeline/data/scan.py) ran, was reused from `<runs_dir>/.data-scan`
    or was skipped (data.split_sizes declared)."""
    streaming = ((train.get("data") or {}).get("streaming") or {})
    if "declared" in str(streaming.get("counts", "")):
        return "skipped (data.split_sizes declared)"
    if after - before:
        return f"ran (no cached result: written to {cache.name}/)"
    if after:
        return f"reused (cached in {cache.name}/)"
    return "unknown (no scan cache written)"


def tfship_train(label: str, text: str, args, keep_runs: bool = False) -> dict:
    """`tfship train --config` in its own process; the figures of its train.json (the run folder is removed
    afterwards, train.json kept as <label>.train.json beside the log). The runs_dir is fresh unless
    `keep_runs` (then its `.data-scan` cache may be reused)."""
    logs = args.work / "logs"
    runs = args.work / "runs" / label
    if not keep_runs:
        shutil.rmtree(runs, ignore_errors=True)
    config = logs / f"{label}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text.replace("@RUNS@", str(runs)))
    cache = runs / ".data-scan"
    before = {p.name for p in cache.glob("*.json")}
    process = run_process([sys.executable, "-m", "tfship.pipeline.cli", "train", "--config", str(config)],
                          logs / f"{label}.log", args.timeout_s)
    after = {p.name for p in cache.glob("*.json")}
    folders = [p for p in runs.iterdir() if not p.name.startswith(".") and (p / "train.json").is_file()]
    if len(folders) != 1:
        raise RuntimeError(f"{label}: expected one run folder with train.json under {runs}, found {folders}")
    train = json.loads((folders[0] / "train.json").read_text())
    shutil.copy(folders[0] / "train.json", logs / f"{label}.train.json")
    keras_file = folders[0] / "model.keras"
    precision = layer_precisions(keras_file) if keras_file.is_file() else None
    if keep_runs:
        shutil.rmtree(folders[0], ignore_errors=True)
    else:
        shutil.rmtree(runs, ignore_errors=True)
    steps, batch = int(train["steps"]), int(train.get("global_batch") or 0)
    records = steps * batch
    figures = train.get("input") or {}
    scan = _find(train.get("data"), "scan")
    row = {"steps": steps, "batch": batch, "train_seconds": train.get("seconds"),
           "steps_per_second": train.get("steps_per_second"),
           "whole_process_records_per_second": round(records / process["wall_s"], 1),
           "records_per_cpu_second": round(records / max(process["cpu_s"], 1e-9), 1), **process,
           "scan": scan_status(train, before, after, cache),
           "scan_seconds": scan.get("seconds") if isinstance(scan, dict) else None,
           "jit_compile": train.get("jit_compile"), "train_step_traces": train.get("train_step_traces"),
           "steps_per_execution": train.get("steps_per_execution"), "mixed_precision": train.get("mixed_precision"),
           "layers": precision, "model_dtype_policy": precision["compute"] if precision else None}
    if figures.get("records_per_second"):
        row["records_per_second"], row["figure"] = figures["records_per_second"], (
            "train.json input.records_per_second (the K-step blocks after the first: steps x batch / their wall time)")
        row["steps_measured"] = figures.get("steps_measured")
        row["input_wait_share"] = figures.get("input_wait_share")
    else:  # no input figures: steps/s of the whole fit, compile and validation included
        row["records_per_second"] = round(float(train["steps_per_second"]) * batch, 1)
        row["figure"] = "train.json steps_per_second x batch (the whole fit: compile and validation included)"
    return row


def reference(label: str, words: list[str], args) -> dict:
    logs = args.work / "logs"
    process = run_process([sys.executable, "-m", "bench.train.loop_reference", *words], logs / f"{label}.log",
                          args.timeout_s)
    lines = (logs / f"{label}.log").read_text().strip().splitlines()
    result = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    return result | {"process": process}


# ---------------------------------------------------------------- the cases' configs
def _train_keys(args, **extra) -> dict:
    keys = {"epochs": 1, "learning_rate": 0.003, "optimizer": "adam", "clip_global_norm": 0.0,
            "jit_compile": True, "checkpoint_every_steps": 0, "tensorboard": False, "progress_every_s": 5.0}
    if has_steps_per_execution() and args.tfship_spe != "omit":
        keys["steps_per_execution"] = int(args.tfship_spe) if args.tfship_spe.isdigit() else args.tfship_spe
    return keys | extra


def mlp_config(paths: dict, args, split_sizes: dict | None = None) -> str:
    """The MLP case's config; `split_sizes` declared: no counted pass (data.split_sizes)."""
    data = {"source": "tfrecord", "train_path": paths["train"], "validation_path": paths["validation"],
            "test_path": paths["test"], "features": ["x"], "label": "label", "input_name": "features",
            "classes": [str(i) for i in range(10)], "batch_size": 256, "shuffle_buffer": 2048, "sample_size": 500}
    if split_sizes:
        data["split_sizes"] = split_sizes
    spec = {"x": {"dtype": "float32", "shape": [32]}, "label": {"dtype": "int64"}}
    return config_text("loop_mlp", Path("@RUNS@"), data, spec, {"kind": "mlp", "hidden_units": [16], "dropout": 0.0},
                       _train_keys(args))


def cnn_config(args) -> str:
    model = {"kind": "cnn", "filters": [32, 64], "dense_units": 256, "dropout": 0.1}
    data = {"source": "digits", "validation_fraction": 0.15, "test_fraction": 0.2, "batch_size": 64,
            "shuffle_buffer": 2048}
    return config_text("loop_cnn", Path("@RUNS@"), data, {}, model, _train_keys(args, epochs=args.cnn_epochs))


def rec_config(manifest: dict, folder: Path, args, *, table: int, mode: str, precision: str) -> str:
    def glob(names):
        return str(folder / names[0]) if len(names) == 1 else str(folder / "part-0000[0-5]-of-00008.tfrecord")

    data = {"source": "tfrecord", "train_path": glob(manifest["train"]), "validation_path": glob(manifest["validation"]),
            "test_path": glob(manifest["test"]), "label": "label", "batch_size": 512, "shuffle_buffer": 2048,
            "sample_size": 500}
    spec = {"user_id": {"dtype": "int64", "kind": "categorical", "num_ids": table},
            "item_id": {"dtype": "int64", "kind": "categorical", "num_ids": REC_ITEMS},
            "history": {"dtype": "int64", "kind": "sequence", "num_ids": REC_ITEMS, "length": REC_HISTORY},
            "dense": {"dtype": "float32", "shape": [4]}, "label": {"dtype": "int64"}}
    model = {"kind": "recommender", "task": "binary", "embedding_dim": 32, "hidden_units": [64, 32], "dropout": 0.0}
    train = _train_keys(args, jit_compile=mode == "xla", run_eagerly=mode == "eager", mixed_precision=precision,
                        max_steps=args.rec_steps if mode != "eager" else args.rec_eager_steps)
    return config_text("loop_rec", Path("@RUNS@"), data, spec, model, train)


def rec_data(args) -> tuple[dict, Path]:
    """The recommender shards (pipeline.data.recommender_data), written once and kept (manifest.json's spec)."""
    from dataclasses import asdict

    from tfship.pipeline.data.recommender_data import RecommenderDataSpec, write_recommender_data

    folder = args.work / f"recommender-{args.rec_records}"
    spec = RecommenderDataSpec(records=args.rec_records, shards=8, users=REC_USERS, items=REC_ITEMS,
                               history_length=REC_HISTORY)
    manifest = folder / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("spec") == asdict(spec):
        return json.loads(manifest.read_text()), folder
    return write_recommender_data(folder, spec, say=say), folder


# ---------------------------------------------------------------- summaries
def spread(values: list[float]) -> dict:
    values = [float(v) for v in values]
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "all": [round(v, 3) for v in values]}


