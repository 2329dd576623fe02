"""`make bench-train-loop` (issue 39): `tfship train` against a hand-written Keras `fit` on the same data, model,
batch, optimizer (Adam, no clipping, the same learning rate) and XLA setting, ratios taken within one run.

    python -m bench.train.loop_vs_fit [--out bench/results] [--records 1000000] [--e2e-small 100000]
                                       [--e2e-variants cold,declared] [--repeats 3] [--quick]
                                       [--cases mlp,cnn,rec,modes]

Cases (each `tfship train` and each reference is its own process; a round runs every process of a case once,
the order rotated between rounds, and the ratios are the medians of the per-round ratios):

1. `mlp` (overhead-bound): N tf.Examples (x float32 [32], label 0..9) in 8 TFRecord shards, 32 -> 16 relu -> 10,
   batch 256, Adam, XLA, one epoch. tfship: train.json `input.records_per_second`. Reference
   (bench/train/loop_reference.py): Keras fit over TFRecordDataset -> shuffle -> batch(256, drop_remainder) ->
   parse_example -> prefetch, `steps_per_execution` 1, 32 and 256 (each reported); the best K is the
   reference. Both figures are timed over the same span: the K-step blocks after the first (which traces,
   compiles and fills the pipeline), their steps x batch over their summed wall time (tfship's `InputMeter`;
   the reference's block callback). Target: tfship >= 1.0x.
2. `cnn`: the digits CNN of configs/digits.toml (its model, batch 64, XLA) vs Keras fit of the same layers on
   the same train arrays, `--cnn-epochs` epochs.
3. `rec`: the recommender with a 5 M-row user table (ids drawn from 50 k users) through `tfship train`
   (model.kind recommender) vs Keras fit of the factory's model, `--rec-steps` steps of batch 512, XLA. Adam's
   moment updates touch the whole table (seconds a step here), so these runs are few and short
   (`--rec-repeats` rounds, default 1).
4. end to end: the marginal rate of whole `tfship train` processes, (N - n) / (T_N - T_n) records/s, from a run
   on N records (the `mlp` case's) and one on n = `--e2e-small` records (default N / 10; the same 8-shard
   layout and the same 2,000-record validation and test files), T being each process's wall time (start-up,
   the counted pass, training, evaluation, saving); against plain tf.data merely reading + parsing the N
   shards (TFRecordDataset -> batch(256) -> parse_example -> prefetch, records/s). Target >= 0.5x. Two
   variants, each reported with whether the counted pass (pipeline/data/scan.py, cached in
   `<runs_dir>/.data-scan`) ran, was reused or was skipped: `cold` (a fresh runs_dir: the scan runs) and
   `declared` (`data.split_sizes` given: no scan).
5. `modes`: the recommender through `tfship train` itself: eager (`train.run_eagerly`), tf.function and XLA, in
   float32 and mixed_bfloat16 (5 M-row table), and the 5 M- against a 50 k-row user table (tf.function, XLA).

Every `tfship train` row says what its layers computed in, read back from the run's model.keras (each layer's
dtype policy). `train.steps_per_execution` (the new loop's key) is passed only when this tfship's
`TrainSection` has it (`--tfship-spe`, default auto). Data is generated once into bench/work/train-loop/
(seeded) and kept. Writes train-loop-latest.json (every figure, each round, spread, host), train-loop-latest.md
(the table, PASS/MISS) and train-loop-latest.png into `--out`. `--quick`: tiny data (20 k and 5 k records), one
round, one reference K (32), short runs (the smoke test's mode, with `--cases mlp --e2e-variants cold`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

from bench.host import ROOT, host_info, uptime

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


def _fit(r: dict, spe: int) -> dict:
    return next(f for f in r["reference"]["fits"] if f["steps_per_execution"] == spe)


def versus_fit(rounds: list[dict], target: float | None) -> dict:
    """The summary of a tfship-vs-Keras-fit case: tfship's figures, each K's reference, the best K, the ratio.

    Like for like: tfship's steady figure (train.json `input.records_per_second`: its K-step blocks after the
    first, summed) against the reference's fit timed the same way (its blocks after the first, summed: see
    loop_reference); where tfship reports only its whole fit, against the reference's whole fit (cold).
    """
    steady = "input.records_per_second" in rounds[0]["tfship"]["figure"]
    key = "records_per_second" if steady else "cold_records_per_second"
    spes = [f["steps_per_execution"] for f in rounds[0]["reference"]["fits"]]
    by_spe = {k: spread([_fit(r, k)[key] for r in rounds]) for k in spes}
    best = max(spes, key=lambda k: by_spe[k]["median"])
    paired = [r["tfship"]["records_per_second"] / _fit(r, best)[key] for r in rounds]
    summary = {
        "tfship_records_per_second": spread([r["tfship"]["records_per_second"] for r in rounds]),
        "tfship_figure": rounds[0]["tfship"]["figure"],
        "tfship_whole_process_records_per_second": spread(
            [r["tfship"]["whole_process_records_per_second"] for r in rounds]),
        "reference_figure": ("Keras fit's K-step blocks after the first, summed (the first traces, compiles and "
                             "fills the pipeline: left out, as tfship's meter leaves out its first block)" if steady
                             else "the whole fit (compile included, as in tfship's figure)"),
        "reference_records_per_second_by_steps_per_execution": {str(k): v for k, v in by_spe.items()},
        "reference_steady_records_per_second_by_steps_per_execution": {
            str(k): spread([_fit(r, k)["records_per_second"] for r in rounds]) for k in spes},
        "reference_best_steps_per_execution": best, "ratio": spread(paired)}
    if target is not None:
        summary |= {"target": f">= {target}", "pass": summary["ratio"]["median"] >= target}
    return summary


# ---------------------------------------------------------------- the cases
def _rounds(name: str, jobs: dict, args, repeats: int | None = None) -> list[dict]:
    """Each job once per round, the order rotated between rounds; progress lines as they finish. Under
    `--parallel` (the smoke test's mode) a round's processes run at the same time: quick, figures not
    comparable."""
    rounds = []
    names = list(jobs)
    repeats = repeats or args.repeats

    def one(job: str, index: int) -> dict:
        started = time.perf_counter()
        result = jobs[job](f"{name}-{job}-r{index + 1}")
        rate = result.get("records_per_second") or max(
            (f["records_per_second"] for f in result.get("fits", [])), default=0.0)
        say(f"{name} round {index + 1}/{repeats}: {job} {rate:,.0f} records/s "
            f"({time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f})")
        return result

    for index in range(repeats):
        shift = index % len(names)
        order = names[shift:] + names[:shift]
        if args.parallel:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(order)) as pool:
                futures = {job: pool.submit(one, job, index) for job in order}
            rounds.append({job: futures[job].result() for job in order})
        else:
            rounds.append({job: one(job, index) for job in order})
    return rounds


def _marginal(big: dict, small: dict, n_big: int, n_small: int) -> float | None:
    """(N - n) / (T_N - T_n): records/s of the records a bigger run adds (whole `tfship train` processes); None
    when T_N <= T_n (tiny sizes: the difference is lost in the noise of the processes' start-up)."""
    extra = big["wall_s"] - small["wall_s"]
    return round((n_big - n_small) / extra, 1) if extra > 0 else None


def end_to_end_summary(rounds: list[dict], variant: str, n_big: int, n_small: int) -> dict:
    big, small = ("tfship", "tfship_small") if variant == "cold" else ("tfship_declared", "tfship_small_declared")
    rates = [_marginal(r[big], r[small], n_big, n_small) for r in rounds]
    reads = [r["reference"]["read"]["records_per_second"] for r in rounds]
    ratios = [rate / read for rate, read in zip(rates, reads, strict=True) if rate is not None]
    measured = [rate for rate in rates if rate is not None]
    summary = {
        "variant": variant,
        "what": ("cold: a fresh runs_dir each run, so the counted pass (the scan) reads every record first"
                 if variant == "cold" else "declared: data.split_sizes given, so there is no counted pass"),
        "marginal_records_per_second": spread(measured) if measured else None,
        "marginal_rounds_measured": f"{len(measured)} of {len(rounds)}",
        "read_parse_records_per_second": spread(reads),
        "wall_s": {f"{n_big:,}": spread([r[big]["wall_s"] for r in rounds]),
                   f"{n_small:,}": spread([r[small]["wall_s"] for r in rounds])},
        "train_loop_seconds": {f"{n_big:,}": spread([r[big]["train_seconds"] for r in rounds]),
                               f"{n_small:,}": spread([r[small]["train_seconds"] for r in rounds])},
        "scan": {f"{n_big:,}": sorted({r[big]["scan"] for r in rounds}),
                 f"{n_small:,}": sorted({r[small]["scan"] for r in rounds})},
        "scan_seconds": {f"{n_big:,}": [r[big]["scan_seconds"] for r in rounds],
                         f"{n_small:,}": [r[small]["scan_seconds"] for r in rounds]},
        "target": f">= {TARGETS['end_to_end']}"}
    if ratios:
        summary |= {"ratio": spread(ratios), "pass": statistics.median(ratios) >= TARGETS["end_to_end"]}
    else:
        summary |= {"ratio": None, "pass": None}
    return summary


def case_mlp(args) -> tuple[dict, dict]:
    """The MLP case and the end-to-end case in one set of rounds: `tfship` (N records, fresh runs_dir) is the
    MLP case's tfship run and the end-to-end case's cold N run."""
    from bench.train.loop_data import HELD_OUT, mlp_shards

    n_big, n_small = args.records, args.e2e_small
    paths = mlp_shards(args.work / f"mlp-{n_big}", n_big, say=say)
    small_paths = mlp_shards(args.work / f"mlp-{n_small}", n_small, say=say)
    words = ["--case", "mlp", "--train", paths["train"], "--spe", args.spe, "--read"]
    jobs = {"tfship": lambda label: tfship_train(label, mlp_config(paths, args), args),
            "reference": lambda label: reference(label, words, args),
            "tfship_small": lambda label: tfship_train(label, mlp_config(small_paths, args), args)}
    variants = [v.strip() for v in args.e2e_variants.split(",") if v.strip()]
    if "declared" in variants:
        def sizes(n):
            return {"train": n, "validation": HELD_OUT, "test": HELD_OUT}

        jobs["tfship_declared"] = lambda label: tfship_train(label, mlp_config(paths, args, sizes(n_big)), args)
        jobs["tfship_small_declared"] = lambda label: tfship_train(
            label, mlp_config(small_paths, args, sizes(n_small)), args)
    rounds = _rounds("mlp", jobs, args)
    mlp_rounds = [{"tfship": r["tfship"], "reference": r["reference"]} for r in rounds]
    mlp = {"records": n_big, "shards": 8, "model": "32 -> 16 relu -> 10", "batch": 256, "xla": True,
           "rounds": mlp_rounds, "summary": versus_fit(mlp_rounds, TARGETS["mlp"])}
    end_to_end = {
        "records": {"big": n_big, "small": n_small, "held_out_each": HELD_OUT, "shards": 8},
        "definition": f"marginal rate of whole `tfship train` processes: ({n_big:,} - {n_small:,}) / "
                      f"(T_{n_big:,} - T_{n_small:,}) records/s (T: the process's wall time: start-up, scan, training, "
                      "evaluation, saving), against plain tf.data read + parse of the same "
                      f"{n_big:,}-record shards (records/s, in the reference process)",
        "variants": {v: end_to_end_summary(rounds, v, n_big, n_small) for v in ("cold", "declared") if v in variants},
        "rounds": [{k: v for k, v in r.items() if k != "reference"} | {"read": r["reference"]["read"]}
                   for r in rounds]}
    return mlp, end_to_end


def case_cnn(args) -> dict:
    text = cnn_config(args)
    words = ["--case", "cnn", "--epochs", str(args.cnn_epochs), "--spe", args.spe]
    rounds = _rounds("cnn", {"tfship": lambda label: tfship_train(label, text, args),
                             "reference": lambda label: reference(label, words, args)}, args)
    return {"data": "scikit-learn digits, tfship's train split", "epochs": args.cnn_epochs, "batch": 64, "xla": True,
            "rounds": rounds, "summary": versus_fit(rounds, None)}


def _rec_tfship(manifest, folder, args, table, mode, precision):
    text = rec_config(manifest, folder, args, table=table, mode=mode, precision=precision)
    return lambda label: tfship_train(label, text, args)


def _key(mode: str, precision: str, table: int) -> str:
    return f"{mode}_{precision}_{table}"


def case_recommender(args, manifest: dict, folder: Path, cases: list[str]) -> dict:
    """The `rec` and `modes` cases in one set of rounds (the XLA float32 5 M-row `tfship train` run is both
    `rec`'s tfship figure and a row of `modes`)."""
    big = args.big_table
    grid = [(m, p, big) for m, p in (QUICK_MODES if args.quick else MODES)] if "modes" in cases else []
    if "modes" in cases:
        grid += [("tf.function", "float32", SMALL_TABLE)] + ([] if args.quick else [("xla", "float32", SMALL_TABLE)])
    if "rec" in cases and ("xla", "float32", big) not in grid:
        grid.append(("xla", "float32", big))
    jobs = {_key(*g): _rec_tfship(manifest, folder, args, g[2], g[0], g[1]) for g in grid}
    if "rec" in cases:
        words = ["--case", "rec", "--train", str(folder / "part-0000[0-5]-of-00008.tfrecord"), "--spe", args.rec_spe,
                 "--steps", str(args.rec_steps), "--user-rows", str(big), "--item-rows", str(REC_ITEMS)]
        jobs["reference"] = lambda label: reference(label, words, args)
    rounds = _rounds("rec", jobs, args, args.rec_repeats)
    out = {}
    if "rec" in cases:
        paired = [{"tfship": r[_key("xla", "float32", big)], "reference": r["reference"]} for r in rounds]
        out["rec"] = {"records": args.rec_records, "user_table_rows": big, "user_ids_drawn_from": REC_USERS,
                      "batch": 512, "steps": args.rec_steps, "xla": True, "rounds": paired,
                      "summary": versus_fit(paired, None)}
    if "modes" in cases:
        out["modes"] = modes_summary(grid, rounds, args)
    return out


def modes_summary(grid: list[tuple], rounds: list[dict], args) -> dict:
    rows = {}
    for mode, precision, table in grid:
        runs = [r[_key(mode, precision, table)] for r in rounds]
        rows[_key(mode, precision, table)] = {
            "mode": mode, "precision": precision, "user_table_rows": table, "steps": runs[0]["steps"],
            "records_per_second": spread([r["records_per_second"] for r in runs]),
            "ms_per_step": spread([1000.0 * r["batch"] / r["records_per_second"] for r in runs]),
            "whole_process_records_per_second": spread([r["whole_process_records_per_second"] for r in runs]),
            "train_seconds": spread([r["train_seconds"] for r in runs]), "wall_s": spread([r["wall_s"] for r in runs]),
            "model_dtype_policy": runs[0]["model_dtype_policy"], "layers": runs[0]["layers"],
            "figure": runs[0]["figure"]}

    def ratio(a: tuple, b: tuple) -> dict | None:
        if _key(*a) not in rows or _key(*b) not in rows:
            return None
        return spread([r[_key(*a)]["records_per_second"] / r[_key(*b)]["records_per_second"] for r in rounds])

    big, small = args.big_table, SMALL_TABLE
    wanted = {"tf.function / eager (float32)": (("tf.function", "float32", big), ("eager", "float32", big)),
              "xla / tf.function (float32)": (("xla", "float32", big), ("tf.function", "float32", big)),
              "xla / eager (float32)": (("xla", "float32", big), ("eager", "float32", big)),
              "mixed_bfloat16 / float32 (xla)": (("xla", "mixed_bfloat16", big), ("xla", "float32", big)),
              "mixed_bfloat16 / float32 (tf.function)": (("tf.function", "mixed_bfloat16", big),
                                                         ("tf.function", "float32", big)),
              f"{small:,} / {big:,} rows (tf.function)": (("tf.function", "float32", small),
                                                          ("tf.function", "float32", big)),
              f"{small:,} / {big:,} rows (xla)": (("xla", "float32", small), ("xla", "float32", big))}
    ratios = {name: value for name, (a, b) in wanted.items() if (value := ratio(a, b)) is not None}
    notes = []
    if any(r["precision"] == "mixed_bfloat16" and r["model_dtype_policy"] == "float32" for r in rows.values()):
        notes.append("train.mixed_precision = mixed_bfloat16 left the recommender's layers float32 (model.keras "
                     "config): the policy was not applied, so the bf16 rows time float32")
    else:
        notes.append("layers' compute dtype read back from each run's model.keras (dtype policy per layer): " + "; ".join(
            f"{r['mode']} {r['precision']}: {(r.get('layers') or {}).get('text', 'n/a')}" for r in rows.values()))
    return {"records": args.rec_records, "batch": 512, "steps": args.rec_steps, "eager_steps": args.rec_eager_steps,
            "user_ids_drawn_from": REC_USERS, "rows": rows,
            "ratios": {"records_per_second": ratios}, "ratios_read": "a / b of records/s: above 1, a is faster",
            "notes": notes}


# ---------------------------------------------------------------- the report
def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def checks(results: dict) -> list[dict]:
    rows = []
    cases = results["cases"]
    for key, title in (("mlp", "tiny MLP (overhead-bound), tfship / tuned Keras fit"),
                       ("cnn", "digits CNN, tfship / Keras fit"),
                       ("rec", f"recommender {results['settings']['big_table']:,}-row user table, tfship / Keras fit")):
        if key not in cases:
            continue
        s = cases[key]["summary"]
        best = s["reference_best_steps_per_execution"]
        rows.append({"case": key, "measure": title, "tfship": s["tfship_records_per_second"]["median"],
                     "reference": s["reference_records_per_second_by_steps_per_execution"][str(best)]["median"],
                     "reference_detail": f"K={best} of " + ", ".join(
                         f"K={k} {_fmt(v['median'])}"
                         for k, v in s["reference_records_per_second_by_steps_per_execution"].items()),
                     "ratio": s["ratio"], "target": s.get("target"), "pass": s.get("pass")})
    for variant, s in (cases.get("end_to_end") or {}).get("variants", {}).items():
        title = {"cold": "end to end, cold (scan included): marginal records/s of `tfship train` / plain read + parse",
                 "declared": "end to end, split sizes declared (no scan): marginal records/s / plain read + parse"}
        rows.append({"case": f"end_to_end_{variant}", "measure": title[variant],
                     "tfship": (s["marginal_records_per_second"] or {}).get("median"),
                     "reference": s["read_parse_records_per_second"]["median"], "reference_detail": "read + parse",
                     "ratio": s["ratio"], "target": s["target"], "pass": s["pass"]})
    return rows


def markdown(results: dict) -> str:
    host = results["host"]
    lines = ["# `tfship train` against a hand-written Keras fit (`make bench-train-loop`)", "",
             f"Host: {host['cpus']} CPUs, 1-min load {host['loadavg_1m']:.1f} at the start (shared machine), commit "
             f"{host['git_commit']}; `{results['command']}`; {results['repeats']} round(s); {results['seconds']:.0f} s; "
             f"tfship `train.steps_per_execution`: {results['tfship_steps_per_execution']}.", "",
             "Ratios are medians of per-round ratios (each round runs tfship and the reference back to back, in "
             "their own processes); [min, max] over the rounds." + (
                 " **--parallel: a round's processes ran at the same time (a smoke run): the figures are not "
                 "comparable.**" if results["parallel"] else ""), "",
             "| case | tfship records/s | reference records/s | ratio | rounds | target | verdict |",
             "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for c in results["checks"]:
        if c["ratio"] is None:  # the end-to-end marginal at sizes too close to measure (T_N <= T_n)
            lines.append(f"| {c['measure']} | not measurable (T_N <= T_n) | {_fmt(c['reference'])} "
                         f"({c['reference_detail']}) | n/a | | {c['target'] or ''} | NOT MEASURED |")
            continue
        verdict = "" if c["pass"] is None else ("PASS" if c["pass"] else "MISS")
        lines.append(f"| {c['measure']} | {_fmt(c['tfship'])} | {_fmt(c['reference'])} ({c['reference_detail']}) | "
                     f"**{c['ratio']['median']:.3f}** | [{c['ratio']['min']:.3f}, {c['ratio']['max']:.3f}] | "
                     f"{c['target'] or ''} | {verdict} |")
    cases = results["cases"]
    for key in ("mlp", "cnn", "rec"):
        if key not in cases:
            continue
        s = cases[key]["summary"]
        first = cases[key]["rounds"][0]["tfship"]
        lines += ["", f"## {key}", "", f"- tfship figure: {s['tfship_figure']}; whole process "
                  f"{_fmt(s['tfship_whole_process_records_per_second']['median'])} records/s",
                  f"- tfship's layers computed in: {(first['layers'] or {}).get('text', 'unknown (no model.keras)')} "
                  f"(train.mixed_precision {first['mixed_precision']}; read back from model.keras)",
                  f"- reference figure: {s['reference_figure']}; steady (compile excluded) by K: " + ", ".join(
                      f"K={k} {_fmt(v['median'])}"
                      for k, v in s["reference_steady_records_per_second_by_steps_per_execution"].items())]
    if "end_to_end" in cases:
        e2e = cases["end_to_end"]
        lines += ["", "## end to end", "", f"- {e2e['definition']}"]
        for variant, s in e2e["variants"].items():
            rate = s["marginal_records_per_second"]
            walls = ", ".join(f"T_{n} {v['median']:.1f} s" for n, v in s["wall_s"].items())
            loops = ", ".join(f"{n}: {v['median']:.1f} s" for n, v in s["train_loop_seconds"].items())
            scans = "; ".join(f"{n}: {', '.join(v)}" for n, v in s["scan"].items())
            lines.append(f"- **{variant}** ({s['what']}): marginal {_fmt(rate['median']) if rate else 'n/a'} "
                         f"records/s ({s['marginal_rounds_measured']} rounds measurable); {walls}; train loop "
                         f"{loops}; the scan: {scans}; scan seconds {s['scan_seconds']}")
    if "modes" in cases:
        m = cases["modes"]
        lines += ["", f"## The recommender through `tfship train` ({m['steps']} steps of batch {m['batch']}, eager "
                  f"{m['eager_steps']})", "", "| mode | precision | user table rows | records/s | ms/step | "
                  "whole-process records/s | layers computed in |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for r in m["rows"].values():
            lines.append(f"| {r['mode']} | {r['precision']} | {r['user_table_rows']:,} | "
                         f"{_fmt(r['records_per_second']['median'])} | {r['ms_per_step']['median']:.1f} | "
                         f"{_fmt(r['whole_process_records_per_second']['median'])} | {r['model_dtype_policy']} |")
        lines += ["", "| ratio | median | [min, max] |", "| --- | ---: | --- |"]
        lines += [f"| {k} | {v['median']:.3f} | [{v['min']:.3f}, {v['max']:.3f}] |"
                  for k, v in next(iter(m["ratios"].values())).items()]
        lines += [f"\n- {note}" for note in m["notes"]]
        lines.append(f"- figure: {next(iter(m['rows'].values()))['figure']}")
    lines += ["", "![ratios](train-loop-latest.png)", ""]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["checks"] if r["ratio"] is not None]  # an unmeasurable end to end: not drawn
    modes = results["cases"].get("modes")
    figure, axes = plt.subplots(1, 2 if modes else 1, figsize=(12 if modes else 7, 4.5), squeeze=False)
    axis = axes[0][0]
    names = [r["case"] for r in rows]
    values = [r["ratio"]["median"] for r in rows]
    errors = [[v - r["ratio"]["min"] for v, r in zip(values, rows, strict=True)],
              [r["ratio"]["max"] - v for v, r in zip(values, rows, strict=True)]]
    colours = ["tab:gray" if r["pass"] is None else ("tab:green" if r["pass"] else "tab:red") for r in rows]
    axis.barh(names, values, xerr=errors, color=colours)
    for i, r in enumerate(rows):
        if r["target"]:
            target = float(r["target"].split()[-1])
            axis.plot([target, target], [i - 0.4, i + 0.4], color="black", linestyle="--")
    axis.set_xlabel("tfship / reference (records/s, median of rounds; dashed: target)")
    axis.set_title("tfship train vs Keras fit / plain read")
    if modes:
        axis = axes[0][1]
        labels = [f"{r['mode']}\n{r['precision'].replace('mixed_', '')}\n{r['user_table_rows'] // 1000}k"
                  for r in modes["rows"].values()]
        axis.bar(range(len(labels)), [r["ms_per_step"]["median"] for r in modes["rows"].values()])
        axis.set_xticks(range(len(labels)), labels, fontsize=7)
        axis.set_ylabel("ms per step (median)")
        axis.set_title("recommender through tfship train")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _finite(tree) -> bool:
    if isinstance(tree, dict):
        return all(_finite(v) for v in tree.values())
    if isinstance(tree, list):
        return all(_finite(v) for v in tree)
    return not isinstance(tree, float) or math.isfinite(tree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train.loop_vs_fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--cases", default="mlp,cnn,rec,modes")
    parser.add_argument("--records", type=int, default=1_000_000, help="mlp / end to end: training records")
    parser.add_argument("--e2e-small", type=int, default=None, help="end to end: the smaller run's training "
                        "records (default --records / 10)")
    parser.add_argument("--e2e-variants", default="cold,declared", help="end to end: cold (fresh runs_dir: the "
                        "scan runs) and/or declared (data.split_sizes: no scan)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spe", default="1,32,256", help="reference steps_per_execution values (mlp, cnn)")
    parser.add_argument("--rec-spe", default="1", help="reference steps_per_execution values (recommender: seconds "
                        "a step with Adam on a 5 M-row table, so the trip to the host is noise)")
    parser.add_argument("--rec-repeats", type=int, default=1, help="rounds of the recommender cases (each ~20 min "
                        "on 2 cores at 5 M rows)")
    parser.add_argument("--tfship-spe", default="auto", help="train.steps_per_execution when tfship has the key; "
                        "'omit' never passes it")
    parser.add_argument("--cnn-epochs", type=int, default=60)
    parser.add_argument("--rec-records", type=int, default=50_000)
    parser.add_argument("--rec-steps", type=int, default=12, help="recommender steps per run (max_steps)")
    parser.add_argument("--rec-eager-steps", type=int, default=4)
    parser.add_argument("--big-table", type=int, default=5_000_000, help="user table rows of the large table")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per process")
    parser.add_argument("--quick", action="store_true", help="tiny data, one round, short runs, --parallel "
                        "(smoke test)")
    parser.add_argument("--parallel", action="store_true", help="run a round's processes at the same time (quick; "
                        "the figures are then not comparable)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.quick:
        args.records, args.repeats, args.cnn_epochs = min(args.records, 20_000), 1, 1
        args.rec_records, args.rec_steps, args.rec_eager_steps = min(args.rec_records, 8_000), 4, 2
        args.spe, args.rec_spe, args.big_table = "32", "1", min(args.big_table, 100_000)
        args.e2e_small, args.parallel = min(args.e2e_small or 5_000, args.records // 2), True
    args.e2e_small = args.e2e_small or max(1, args.records // 10)
    if not 0 < args.e2e_small < args.records:
        parser.error(f"--e2e-small {args.e2e_small}: between 0 and --records {args.records}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    started = time.perf_counter()
    results: dict = {"schema": SCHEMA, "command": "python -m bench.train.loop_vs_fit " + " ".join(
        argv if argv is not None else sys.argv[1:]), "host": host_info() | {"uptime": uptime()},
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeats": args.repeats,
        "quick": args.quick, "parallel": args.parallel, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tfship_steps_per_execution": (args.tfship_spe if has_steps_per_execution() and args.tfship_spe != "omit"
                                       else "not passed (TrainSection has no steps_per_execution)"
                                       if not has_steps_per_execution() else "not passed (--tfship-spe omit)"),
        "cases": {}}
    say(f"cases {cases}, {args.repeats} round(s), {args.records:,} mlp records; load {os.getloadavg()[0]:.1f}")
    if "mlp" in cases:
        results["cases"]["mlp"], results["cases"]["end_to_end"] = case_mlp(args)
    if "cnn" in cases:
        results["cases"]["cnn"] = case_cnn(args)
    if "rec" in cases or "modes" in cases:
        manifest, folder = rec_data(args)
        results["cases"] |= case_recommender(args, manifest, folder, cases)
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["checks"] = checks(results)
    results["all_figures_finite"] = _finite(results)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [args.out / "train-loop-latest.json", args.out / "train-loop-latest.md", args.out / "train-loop-latest.png"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown(results))
    plot(results, paths[2])
    print(markdown(results))
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
