"""`make bench-train`: steps/s of the train step in eager mode, as a tf.function, and as an XLA
tf.function, in float32 and mixed precision, on the built-in CNN and a larger MLP (digits data).

Each case: warm-up steps (tracing, XLA compile) not timed, then the median steps/s of several
timed windows. Results: `train_bench.json`, `train_bench.md` and `train_bench.png` in `--out`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MODES = ("eager", "tf.function", "tf.function+xla")
MODELS = {"cnn": {"model.kind": "cnn"},
          "mlp_large": {"model.kind": "mlp", "model.hidden_units": [1024, 1024, 512]}}


@dataclass(frozen=True)
class BenchRow:
    """One case: model, mode, precision; median and spread of steps/s over the timed windows."""

    model: str
    mode: str
    precision: str
    median_steps_per_second: float
    min_steps_per_second: float
    max_steps_per_second: float
    windows: int
    steps_per_window: int
    batch_size: int


def bench_case(model_name: str, mode: str, precision: str, *, warmup: int, windows: int, window_steps: int,
               batch_size: int) -> BenchRow:
    """Time one case on a fixed digits batch (float32 [batch_size, 8, 8, 1]); see the module docstring."""
    import tensorflow as tf

    from tfship.pipeline.config import load_config
    from tfship.pipeline.data.splits import load_split_arrays
    from tfship.pipeline.training.distribute import training_runtime
    from tfship.pipeline.training.model import build_model
    from tfship.pipeline.training.optim import build_optimizer
    from tfship.pipeline.training.train_step import StepFunctions

    config = load_config(None, MODELS[model_name] | {"train.mixed_precision": precision,
                                                     "train.run_eagerly": mode == "eager",
                                                     "data.batch_size": batch_size})
    splits = load_split_arrays(config.data, config.run.seed)
    with training_runtime(config.train, config.run.seed):
        model = build_model(config.model, (8, 8, 1), 10, config.run.seed, precision=precision)
        optimizer = build_optimizer(config.train, 1000)
        optimizer.build(model.trainable_variables)
        spec = tf.TensorSpec([None, 8, 8, 1], tf.float32)
        steps = StepFunctions(model, optimizer, tf.distribute.get_strategy(), jit_compile=mode.endswith("xla"),
                              signature=[spec, tf.TensorSpec([None], tf.int64)], eval_spec=spec,
                              global_batch=batch_size)
        images = tf.constant(splits.train.images[:batch_size])
        labels = tf.constant(splits.train.labels[:batch_size])
        for _ in range(warmup):
            float(steps.train_step(images, labels)[0])
        rates = []
        for _ in range(windows):
            started = time.perf_counter()
            for _ in range(window_steps):
                outputs = steps.train_step(images, labels)
            float(outputs[0])
            rates.append(window_steps / (time.perf_counter() - started))
    return BenchRow(model_name, mode, precision, round(statistics.median(rates), 1), round(min(rates), 1),
                    round(max(rates), 1), windows, window_steps, batch_size)


def write_results(rows: list[BenchRow], out: Path, meta: dict) -> dict[str, Path]:
    """Write JSON, a Markdown table and a grouped bar plot (steps/s) into `out`; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "train_bench.json", "md": out / "train_bench.md", "png": out / "train_bench.png"}
    paths["json"].write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    lines = [f"# Train step benchmark ({meta['machine']})", "",
             f"Median steps/s over {rows[0].windows} windows of {rows[0].steps_per_window} steps after "
             f"{meta['warmup']} warm-up steps; batch {rows[0].batch_size}, digits 8x8x1.", "",
             "| model | mode | precision | median steps/s | min | max |", "| --- | --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {r.model} | {r.mode} | {r.precision} | {r.median_steps_per_second} | {r.min_steps_per_second} | "
              f"{r.max_steps_per_second} |" for r in rows]
    paths["md"].write_text("\n".join(lines) + "\n")
    cases = sorted({(r.model, r.precision) for r in rows})
    figure, axis = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(MODES)
    for offset, mode in enumerate(MODES):
        values = [next((r.median_steps_per_second for r in rows if (r.model, r.precision, r.mode) == (*c, mode)), 0)
                  for c in cases]
        axis.bar([i + offset * width for i in range(len(cases))], values, width, label=mode)
    axis.set_xticks([i + width for i in range(len(cases))], [f"{m}\n{p}" for m, p in cases])
    axis.set_ylabel("train steps / s (median)")
    axis.set_title("tfship train step: eager vs tf.function vs XLA")
    axis.legend()
    figure.tight_layout()
    figure.savefig(paths["png"], dpi=110)
    plt.close(figure)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Run every case and write the results (see `--help`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window-steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    import os

    import tensorflow as tf

    rows = []
    for model_name in args.models:
        for precision in args.precisions:
            for mode in MODES:
                row = bench_case(model_name, mode, precision, warmup=args.warmup, windows=args.windows,
                                 window_steps=args.window_steps, batch_size=args.batch_size)
                print(f"{model_name:10s} {mode:16s} {precision:15s} {row.median_steps_per_second:8.1f} steps/s",
                      flush=True)
                rows.append(row)
    devices = [d.device_type for d in tf.config.list_physical_devices()]
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, devices {devices}",
            "tensorflow": tf.__version__, "warmup": args.warmup}
    for kind, path in write_results(rows, args.out, meta).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
