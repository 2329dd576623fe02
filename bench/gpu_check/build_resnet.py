"""Build the ResNet50-class model of `make gpu-check` in its own process (TensorFlow's memory goes with it).

    python -m bench.gpu_check.build_resnet --version-dir DIR

keras.applications.ResNet50 with `weights=None` (random weights, nothing downloaded), input `x` float32
[-1, 224, 224, 3], output `probabilities` [-1, 1000]: a SavedModel and tf2onnx's `model.onnx` beside it.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check.build_resnet")
    parser.add_argument("--version-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    import keras

    from bench.serve.models import _save_keras
    from tfship.onnx_format.convert import onnx_command

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    _save_keras(model, args.version_dir, "x", (224, 224, 3))
    subprocess.run(onnx_command(args.version_dir, args.version_dir / "model.onnx", "serving_default", 17),
                   check=True, capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
