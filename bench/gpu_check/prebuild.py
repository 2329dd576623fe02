"""Build `make gpu-check`'s heavy MLP here, for a GPU machine whose image has no TensorFlow.

    python -m bench.gpu_check.prebuild --work DIR      # then, there: python -m bench.gpu_check --work DIR

Writes DIR/repo/mlp/1/model.onnx (784 -> 4 x 1024 ReLU -> 10 softmax, float32, input `x` [?, 784], ~16 MB),
converted and checked against TensorFlow by `bench.serve.models.build_mlp` (max |diff| <= 1e-4 on 4 rows), and
keeps only that file and its shape stamp: the SavedModel and TFLite copies would triple what has to travel.
On such a machine the TF-free parts (`scaling`, and `serving` where ONNX Runtime has a CUDA provider) use it;
the TensorFlow parts are skipped with that reason.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from bench.serve.models import build_mlp

KEPT = {"model.onnx", "bench_spec.txt"}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check.prebuild", description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="the folder `python -m bench.gpu_check --work` takes")
    args = parser.parse_args(argv)
    version_dir = args.work / "repo" / "mlp" / "1"
    build_mlp(version_dir)
    for path in version_dir.iterdir():
        if path.name not in KEPT:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    size = (version_dir / "model.onnx").stat().st_size
    print(f"{version_dir / 'model.onnx'}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
