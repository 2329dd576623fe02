"""`make bench-recommender`: the seeds' recommender comparison on this machine.

* step time of one SGD train step (fixed batch, no input): eager, `tf.function`, `tf.function` + XLA, each in
  float32 and mixed_bfloat16 (a case that fails is reported with its error, not dropped);
* input-wait share: the `tf.function` step fed by the streaming pipeline (TFRecord shards -> interleave ->
  batch -> `parse_example` -> prefetch), time in `next()` over the whole step;
* table size: the `tf.function` step with a 50 k-row and a 5 M-row user table (SGD: the embedding gradient is
  `IndexedSlices`, applied with a scatter, so the cost should not follow the table);
* AUC of the recommender trained one epoch (Keras `fit`) on the generator's train shards, on the held-out
  shard, against the planted logit's AUC (`manifest.json`).

Targets (issue 34): tf.function >= 1.9x eager; the 5 M-row step <= 2x the 50 k-row step. Medians of timed
windows after warm-up (tracing, XLA compile). Writes `recommender-latest.json` and `.md` into `--out`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from tfship.pipeline.config import DataSection
from tfship.pipeline.data.recommender_data import RecommenderDataSpec, recommender_feature_spec, write_recommender_data
from tfship.pipeline.training.input_specs import input_specs, parse_batch

TARGET_SPEEDUP, TARGET_TABLE_RATIO = 1.9, 2.0


def _data(folder: Path, spec: RecommenderDataSpec) -> dict:
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest["spec"] == spec.__dict__:
            return manifest
    return write_recommender_data(folder, spec)


def _dataset(folder: Path, names, specs, batch: int, repeat: bool = False):
    import tensorflow as tf

    files = tf.data.Dataset.from_tensor_slices([str(folder / n) for n in names])
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    records = records.repeat() if repeat else records
    return records.batch(batch, drop_remainder=repeat).map(parse_batch(specs, "label"),
                                                           num_parallel_calls=tf.data.AUTOTUNE).prefetch(4)


def _step_function(model, mode: str):
    import keras
    import tensorflow as tf

    optimizer, loss_fn = keras.optimizers.SGD(0.1), keras.losses.BinaryCrossentropy()

    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(tf.cast(labels[:, None], tf.float32), model(inputs, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    return step if mode == "eager" else tf.function(step, jit_compile=mode == "tf.function+xla")


def _time_steps(step, batch, warmup: int, windows: int, window_steps: int) -> dict:
    for _ in range(warmup):
        step(*batch).numpy()
    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(window_steps):
            loss = step(*batch)
        loss.numpy()
        rates.append((time.perf_counter() - start) / window_steps * 1000.0)
    return {"median_ms": round(statistics.median(rates), 3), "min_ms": round(min(rates), 3),
            "max_ms": round(max(rates), 3), "windows": windows, "steps_per_window": window_steps}


def _model(specs, precision: str, seed: int = 0):
    import keras

    from tfship.pipeline.training.multi_input import recommender

    keras.mixed_precision.set_global_policy(precision)
    try:
        return recommender(specs, embedding_dim=32, seed=seed)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def step_modes(specs, batch, args) -> list[dict]:
    rows = []
    for precision in ("float32", "mixed_bfloat16"):
        for mode in ("eager", "tf.function", "tf.function+xla"):
            row = {"mode": mode, "precision": precision}
            try:
                row |= _time_steps(_step_function(_model(specs, precision), mode), batch, args.warmup, args.windows,
                                   args.window_steps)
            except Exception as err:  # noqa: BLE001  (reported: which case fails on this machine and why)
                row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
            print("bench-recommender:", row, flush=True)
            rows.append(row)
    return rows


def table_sizes(specs, batch, args) -> list[dict]:
    """The tf.function step with a 50 k- and a 5 M-row user table, timed in alternating windows (paired, so a
    neighbour's load on this shared machine falls on both alike); ids spread over each whole table.
    """
    from dataclasses import replace

    import numpy as np
    import tensorflow as tf

    cases = []
    for users in (50_000, 5_000_000):
        sized = tuple(replace(s, num_ids=users) if s.name == "user_id" else s for s in specs)
        inputs, labels = batch
        spread = dict(inputs)
        spread["user_id"] = tf.constant(np.random.default_rng(0).integers(0, users, len(labels)), tf.int64)
        step = _step_function(_model(sized, "float32"), "tf.function")
        _time_steps(step, (spread, labels), args.warmup, 1, 1)
        cases.append((users, step, (spread, labels), []))
    for _ in range(args.windows * 3):
        for _, step, step_batch, times in cases:
            times.append(_time_steps(step, step_batch, 0, 1, args.window_steps)["median_ms"])
    rows = [{"user_table_rows": users, "median_ms": round(statistics.median(times), 3), "min_ms": min(times),
             "max_ms": max(times), "windows": len(times), "steps_per_window": args.window_steps}
            for users, _, _, times in cases]
    print("bench-recommender:", rows, flush=True)
    return rows


def input_wait(folder: Path, manifest: dict, specs, args) -> dict:
    step = _step_function(_model(specs, "float32"), "tf.function")
    iterator = iter(_dataset(folder, manifest["train"], specs, args.batch, repeat=True))
    for _ in range(args.warmup):
        step(*next(iterator)).numpy()
    wait = total = 0.0
    for _ in range(args.input_steps):
        start = time.perf_counter()
        batch = next(iterator)
        fetched = time.perf_counter()
        step(*batch).numpy()
        wait, total = wait + fetched - start, total + time.perf_counter() - start
    return {"steps": args.input_steps, "input_wait_share": round(wait / total, 4),
            "step_ms_with_input": round(total / args.input_steps * 1000.0, 3),
            "records_per_second": round(args.input_steps * args.batch / total, 1)}


def trained_auc(folder: Path, manifest: dict, specs, args) -> dict:
    import keras
    import numpy as np

    from tfship.core.tasks import task_metrics

    model = _model(specs, "float32", seed=1)
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.BinaryCrossentropy())
    start = time.perf_counter()
    model.fit(_dataset(folder, manifest["train"], specs, args.batch), epochs=args.epochs, verbose=0)
    seconds = time.perf_counter() - start
    scores, labels = [], []
    for inputs, y in _dataset(folder, manifest["test"], specs, 4096):
        scores.append(model(inputs).numpy())
        labels.append(y.numpy())
    auc = task_metrics("binary", np.concatenate(scores), np.concatenate(labels))["auc"]
    return {"auc": round(auc, 4), "planted_auc": manifest["planted_auc"], "epochs": args.epochs,
            "train_seconds": round(seconds, 1), "test_rows": int(sum(len(y) for y in labels))}


def markdown(report: dict) -> str:
    lines = [f"# Recommender train step ({report['machine']})", "",
             f"Batch {report['batch']}; {report['data']['records']:,} records in {report['data']['shards']} shards "
             f"({report['data']['users']:,} users, {report['data']['items']:,} items, history <= "
             f"{report['data']['history_length']}); SGD; median ms/step over timed windows after warm-up.", "",
             "| mode | precision | median ms/step | min | max |", "| --- | --- | ---: | ---: | ---: |"]
    for row in report["modes"]:
        lines.append(f"| {row['mode']} | {row['precision']} | " + (
            f"{row['median_ms']} | {row['min_ms']} | {row['max_ms']} |" if "median_ms" in row else
            f"failed: {row['error']} | | |"))
    checks = report["checks"]
    lines += ["", f"- tf.function vs eager (float32): **{checks['function_speedup']}x** (target >= {TARGET_SPEEDUP}x: "
              f"{'PASS' if checks['function_speedup_ok'] else 'MISS'})",
              f"- user table 5 M vs 50 k rows: **{checks['table_ratio']}x** step time (target <= {TARGET_TABLE_RATIO}x: "
              f"{'PASS' if checks['table_ratio_ok'] else 'MISS'}); "
              + ", ".join(f"{r['user_table_rows']:,} rows {r['median_ms']} ms" for r in report["table_sizes"]),
              f"- input wait: {report['input']['input_wait_share']:.1%} of the step fed by the streaming pipeline "
              f"({report['input']['records_per_second']:,} records/s)",
              f"- AUC on the held-out shard after {report['auc']['epochs']} epoch(s): **{report['auc']['auc']}** "
              f"against the planted signal's {report['auc']['planted_auc']} ({report['auc']['test_rows']:,} rows)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--work", type=Path, default=Path("bench/work/recommender"))
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--ids", type=int, default=5_000, help="users and items in the data")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=10)
    parser.add_argument("--input-steps", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args(argv)
    spec = RecommenderDataSpec(records=args.records, shards=args.shards, users=args.ids, items=args.ids)
    manifest = _data(args.work, spec)
    specs = input_specs(DataSection(source="tfrecord", path=str(args.work / "*.tfrecord"), label="label",
                                    feature_spec=recommender_feature_spec(spec)))
    batch = next(iter(_dataset(args.work, manifest["train"], specs, args.batch, repeat=True)))
    modes = step_modes(specs, batch, args)
    sizes = table_sizes(specs, batch, args)
    report = {"machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs", "batch": args.batch,
              "data": spec.__dict__, "modes": modes, "table_sizes": sizes,
              "input": input_wait(args.work, manifest, specs, args), "auc": trained_auc(args.work, manifest, specs,
                                                                                          args)}
    by = {(r["mode"], r["precision"]): r.get("median_ms") for r in modes}
    speedup = by[("eager", "float32")] / by[("tf.function", "float32")] if by[("tf.function", "float32")] else 0.0
    ratio = sizes[1]["median_ms"] / sizes[0]["median_ms"]
    report["checks"] = {"function_speedup": round(speedup, 2), "function_speedup_ok": speedup >= TARGET_SPEEDUP,
                        "table_ratio": round(ratio, 2), "table_ratio_ok": ratio <= TARGET_TABLE_RATIO}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recommender-latest.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "recommender-latest.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
