"""Real models for the shadow tests: tiny linear ONNX classifiers (built with onnx.helper), and a `faulty` test
backend whose versions hang or crash, served by `python -m tests.serving.shadow_models serve ...`.

ONNX contract: input `x` float32 [-1, 16]; outputs `logits` float32 [-1, 4] = x @ W + b and `class_id` int64 [-1]
(its argmax). The `faulty` backend serves a folder holding `fault.json` (`{"mode": "hang"}` or `{"mode": "crash"}`)
with the same contract; it is registered last, so `auto` picks it only there (never in the production registry).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature, TensorSpec
from tfship.serving.runtimes import REGISTRY
from tfship.serving.runtimes.base import Runtime

FEATURES, CLASSES = 16, 4


def weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """W float32 [16, 4] and b float32 [4] of the reference classifier."""
    rng = np.random.default_rng(seed)
    return rng.normal(0, 1, (FEATURES, CLASSES)).astype(np.float32), rng.normal(0, 0.1, CLASSES).astype(np.float32)


def write_onnx_version(folder: Path, w: np.ndarray, b: np.ndarray) -> Path:
    """`<folder>/model.onnx` (logits, class_id) and the published marker `manifest.json`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["class_id"], axis=1, keepdims=0)]
    graph = helper.make_graph(
        nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", CLASSES]),
         helper.make_tensor_value_info("class_id", TensorProto.INT64, ["n"])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    (folder / "manifest.json").write_text(json.dumps({"version": int(folder.name), "artifacts": ["model.onnx"]}))
    return folder


def write_published_onnx(root: Path, model: str, left_out: tuple[dict, ...] = ()) -> Path:
    """`<root>/<model>/1/model.onnx` (`write_onnx_version`) with a manifest publishing it as artifact `onnx`
    (files with size and sha256) plus the `left_out` artifact rows; returns `root`."""
    from tfship.pipeline.orchestration.publish import file_inventory

    version = write_onnx_version(root / model / "1", *weights())
    (version / "manifest.json").unlink()
    manifest = {"model_name": model, "version": 1,
                "artifacts": [{"artifact": "onnx", "status": "published", "file": "model.onnx"}, *left_out],
                "files": file_inventory(version)}
    (version / "manifest.json").write_text(json.dumps(manifest))
    return root


def write_faulty_version(folder: Path, mode: str) -> Path:
    """A version folder the `faulty` backend serves: `hang` sleeps an hour per call, `crash` raises."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fault.json").write_text(json.dumps({"mode": mode}))
    (folder / "manifest.json").write_text(json.dumps({"version": int(folder.name)}))
    return folder


class FaultyRuntime(Runtime):
    """The ONNX classifier's contract, answering by hanging or by raising (a shadow gone wrong)."""

    name = "faulty"
    FILE = "fault.json"

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return (Path(version_dir) / cls.FILE).is_file()

    def load(self) -> None:
        self.mode = json.loads((self.version_dir / self.FILE).read_text())["mode"]
        self.ready = True

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        if self.mode == "hang":
            time.sleep(3600)
        raise RuntimeError("the faulty backend crashed, as asked")

    def metadata(self) -> dict[str, Signature]:
        return {"serving_default": Signature(
            name="serving_default", inputs={"x": TensorSpec("float32", (None, FEATURES), "x")},
            outputs={"logits": TensorSpec("float32", (None, CLASSES), "logits"),
                     "class_id": TensorSpec("int64", (None,), "class_id")})}


def main(argv: list[str] | None = None) -> int:
    """`python -m tfship.serving ...` with the `faulty` backend registered."""
    if FaultyRuntime.name not in REGISTRY.names():
        REGISTRY.register(FaultyRuntime.name, FaultyRuntime)
    from tfship.serving import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
