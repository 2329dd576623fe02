"""The hand-written REST reference of `make bench-serve` (`bench.serve.ort_rest`) answers like ONNX Runtime.

A small ONNX graph (MatMul + Softmax, built here with `onnx.helper`) is served by the reference as its own
process; row and columnar `:predict` bodies must come back with ONNX Runtime's own outputs, and a malformed
body must be a 400 (the reference is a fair floor only if it really parses and runs every request).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import requests
from onnx import TensorProto, helper, numpy_helper

from bench.serve.endpoints import ReferenceEndpoint


def _model(path: Path) -> np.ndarray:
    weights = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(weights, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return weights


def test_reference_parses_runs_and_answers_in_tf_serving_shape(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    _model(path)
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["probs"], {"x": x})[0]
    with ReferenceEndpoint("ort_rest", ["--model", str(path)], cpu=None) as server:
        url = server.rest_url("tiny")
        rows = requests.post(url, json={"instances": x.tolist()}, timeout=30)
        columns = requests.post(url, json={"inputs": {"x": x.tolist()}}, timeout=30)
        bad = requests.post(url, data=b'{"instances": ', timeout=30)
    assert rows.status_code == 200 and columns.status_code == 200
    np.testing.assert_allclose([r["probs"] for r in rows.json()["predictions"]], want, rtol=1e-6)
    np.testing.assert_allclose(columns.json()["outputs"]["probs"], want, rtol=1e-6)
    assert bad.status_code == 400 and "JSONDecodeError" in bad.json()["error"]
