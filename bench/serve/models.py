"""The models the serving benchmark loads, as a TF Serving-layout repository under `bench/work/`.

* `digits`: the published digits CNN (`models/digits/<latest>/`: saved_model + model.onnx + model.tflite),
  copied; when none is published, a tiny CNN with the same contract is built here.
* `mlp`: the heavier model: 784 -> 4 x 1024 -> 10 (ReLU, softmax), ~4 M multiply-adds
  per row, saved with `tf.saved_model.save` (serving_default: `x` float32[?,784] -> `probabilities`),
  converted with tf2onnx (opset 17) and TFLiteConverter; both conversions are checked against TF.
* `identity_<model>`: the same input contract served by the `identity` backend (transport ceiling).

Run `python -m bench.serve.models --work bench/work` (idempotent: a model whose folder is complete is
kept). Writes `<work>/repo/...` and `<work>/models.json` (see `ModelInfo`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ("saved_model.pb", "model.onnx", "model.tflite")


@dataclass(frozen=True)
class ModelInfo:
    """One benchmark model.

    Attributes:
        name: model name in the repository.
        input_alias: the serving_default input the requests fill.
        input_shape: one row's shape (without the batch dim).
        source: where it came from (published folder, or `built`).
        macs_per_row: multiply-adds per row (None when not computed).
    """

    name: str
    input_alias: str
    input_shape: tuple[int, ...]
    source: str
    macs_per_row: int | None = None


def latest_version(model_dir: Path) -> Path | None:
    """Highest numeric version folder of `model_dir` that holds every artifact, or None."""
    versions = (
        sorted((int(p.name), p) for p in model_dir.glob("*") if p.name.isdigit() and p.is_dir())
        if model_dir.is_dir()
        else []
    )
    for _, path in reversed(versions):
        if all((path / a).is_file() for a in ARTIFACTS):
            return path
    return None


def _complete(version_dir: Path) -> bool:
    return all((version_dir / a).is_file() for a in ARTIFACTS) and (version_dir / "variables").is_dir()


def _save_keras(model, version_dir: Path, alias: str, shape: tuple[int, ...]) -> None:
    import tensorflow as tf

    class Serving(tf.Module):
        def __init__(self, net) -> None:
            super().__init__()
            self.net = net

        @tf.function(input_signature=[tf.TensorSpec((None, *shape), tf.float32, name=alias)])
        def serve(self, x):
            return {"probabilities": self.net(x, training=False)}

    module = Serving(model)
    tf.saved_model.save(module, str(version_dir), signatures={"serving_default": module.serve})


def _convert(version_dir: Path, alias: str, shape: tuple[int, ...]) -> None:
    """tf2onnx + TFLiteConverter from the SavedModel, then compare both with TF (atol 1e-4); raises on mismatch."""
    import tensorflow as tf

    from tfship.onnx_format.convert import onnx_command

    subprocess.run(
        onnx_command(version_dir, version_dir / "model.onnx", "serving_default", 17),
        check=True,
        capture_output=True,
    )
    # from_saved_model leaves this module's Keras 3 variables as READ_VARIABLE ops that LiteRT cannot run
    # (NaN outputs); converting the loaded concrete function freezes them into constants.
    loaded = tf.saved_model.load(str(version_dir))
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [loaded.signatures["serving_default"]], loaded
    )
    (version_dir / "model.tflite").write_bytes(converter.convert())
    x = np.random.default_rng(0).random((4, *shape), dtype=np.float32)
    want = loaded.signatures["serving_default"](tf.constant(x))["probabilities"]
    from tfship.serving.runtimes import REGISTRY, RuntimeOptions

    failures = []
    for backend in ("onnx", "tflite"):
        runtime = REGISTRY.create(backend, version_dir, RuntimeOptions(use_gpu=False))
        runtime.load()
        got = runtime.predict({alias: x})["probabilities"]
        if not np.allclose(got, want.numpy(), atol=1e-4):
            failures.append(f"{backend}: max |diff| {np.abs(got - want.numpy()).max():.2e} > 1e-4")
    if failures:
        raise RuntimeError(f"conversion check failed for {version_dir}: {failures}")


def build_mlp(version_dir: Path, width: int = 1024, depth: int = 4) -> ModelInfo:
    """The heavy model: 784 -> `depth` x `width` ReLU -> 10 softmax, random weights (seed 0)."""
    info = ModelInfo(
        "mlp", "x", (784,), "built", macs_per_row=784 * width + (depth - 1) * width * width + width * 10
    )
    spec = version_dir / "bench_spec.txt"  # an older run's folder with another shape is rebuilt
    if _complete(version_dir) and spec.is_file() and spec.read_text() == f"{width}x{depth}":
        return info
    import keras

    keras.utils.set_random_seed(0)
    layers = [keras.Input((784,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    model = keras.Sequential(layers + [keras.layers.Dense(10, activation="softmax")])
    shutil.rmtree(version_dir, ignore_errors=True)
    _save_keras(model, version_dir, "x", (784,))
    _convert(version_dir, "x", (784,))
    spec.write_text(f"{width}x{depth}")
    return info


def build_digits(version_dir: Path, published: Path) -> ModelInfo:
    """Copy the latest complete published digits version, else build a tiny CNN with its contract."""
    source = latest_version(published)
    if _complete(version_dir):
        return ModelInfo("digits", "image", (8, 8, 1), str(source) if source else "built")
    shutil.rmtree(version_dir, ignore_errors=True)
    if source is not None:
        shutil.copytree(source, version_dir)
        return ModelInfo("digits", "image", (8, 8, 1), str(source))
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    _save_keras(model, version_dir, "image", (8, 8, 1))
    _convert(version_dir, "image", (8, 8, 1))
    return ModelInfo("digits", "image", (8, 8, 1), "built")


def write_identity(version_dir: Path, info: ModelInfo) -> None:
    """An `identity` backend folder with `info`'s input contract."""
    version_dir.mkdir(parents=True, exist_ok=True)
    spec = {info.input_alias: {"dtype": "float32", "shape": [None, *info.input_shape]}}
    (version_dir / "identity.json").write_text(json.dumps({"inputs": spec}))


def build_repository(work: Path, published: Path = ROOT / "models" / "digits") -> list[ModelInfo]:
    """Build (or keep) every benchmark model under `<work>/repo`; writes `<work>/models.json`."""
    repo = work / "repo"
    infos = [build_digits(repo / "digits" / "1", published), build_mlp(repo / "mlp" / "1")]
    for info in infos:
        write_identity(repo / f"identity_{info.name}" / "1", info)
    (work / "models.json").write_text(json.dumps([asdict(i) for i in infos], indent=1))
    return infos


def load_infos(work: Path) -> list[ModelInfo]:
    """The `ModelInfo`s written by `build_repository`."""
    return [
        ModelInfo(**{**d, "input_shape": tuple(d["input_shape"])})
        for d in json.loads((work / "models.json").read_text())
    ]


def request_bytes(model_name: str, alias: str, shape: tuple[int, ...], rows: int = 1, seed: int = 0) -> bytes:
    """A serialised `tensorflow.serving.PredictRequest` for `model_name` with `rows` random rows in [0, 1)."""
    from tfship.core import protocol
    from tfship.serving.dataplane.tensors import to_tensor_proto

    request = protocol.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = "serving_default"
    x = np.random.default_rng(seed).random((rows, *shape), dtype=np.float32)
    request.inputs[alias].CopyFrom(to_tensor_proto(x))
    return request.SerializeToString()


def main(argv: list[str] | None = None) -> int:
    """CLI: build the repository and print the model list."""
    p = argparse.ArgumentParser(prog="python -m bench.serve.models")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work")
    args = p.parse_args(argv)
    for info in build_repository(args.work):
        print(json.dumps(asdict(info)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
