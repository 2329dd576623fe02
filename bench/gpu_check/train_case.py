"""One training case of `make gpu-check`, in its own process: the digits CNN's XLA train step, steps/s.

    python -m bench.gpu_check.train_case --precision mixed_float16 [--warmup 5 --windows 3 --window-steps 50]

Prints one JSON object: `steps_per_s` (median of the windows), `device` (where the step's loss tensor was
placed, read back from TensorFlow, not assumed) and the precision. Run with `CUDA_VISIBLE_DEVICES=` for the
CPU figure.
"""

from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check.train_case")
    parser.add_argument("--precision", default="float32", choices=["float32", "mixed_float16", "mixed_bfloat16"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    import tensorflow as tf

    from bench.train.run_bench import bench_case

    row = bench_case("cnn", "tf.function+xla", args.precision, warmup=args.warmup, windows=args.windows,
                     window_steps=args.window_steps, batch_size=args.batch_size)
    device = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    probe = tf.function(lambda x: tf.reduce_sum(x * 2.0), jit_compile=True)(tf.ones([8]))
    placed = probe.device or device
    print(json.dumps({"precision": args.precision, "steps_per_s": row.median_steps_per_second,
                      "min_steps_per_s": row.min_steps_per_second, "batch_size": args.batch_size,
                      "device": placed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
