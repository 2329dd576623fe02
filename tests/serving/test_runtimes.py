"""Each backend in-process against the SavedModel called directly; the registry and `auto`."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MODEL, saved_model_outputs

from tfship.core.errors import ConfigError
from tfship.serving.runtimes import REGISTRY, RuntimeLoadError, RuntimeRegistry
from tfship.serving.runtimes.onnx import OnnxRuntime
from tfship.serving.runtimes.saved_model import SavedModelRuntime
from tfship.serving.runtimes.tflite import TfliteRuntime


def test_registry_refuses_duplicates_and_unknown_names():
    registry = RuntimeRegistry()
    registry.register("onnx", OnnxRuntime)
    with pytest.raises(ConfigError, match="already registered"):
        registry.register("onnx", TfliteRuntime)
    with pytest.raises(ConfigError, match="unknown backend 'torch'"):
        registry.create("torch", ".")
    assert REGISTRY.names()[:3] == ["saved_model", "onnx", "tflite"]  # auto's preference order


def test_auto_prefers_saved_model_then_onnx_then_tflite(repository, tmp_path):
    assert isinstance(REGISTRY.create("auto", repository / MODEL / "1"), SavedModelRuntime)
    only_tflite = tmp_path / "1"
    only_tflite.mkdir()
    (only_tflite / "model.tflite").write_bytes((repository / MODEL / "1" / "model.tflite").read_bytes())
    assert isinstance(REGISTRY.create("auto", only_tflite), TfliteRuntime)
    with pytest.raises(RuntimeLoadError, match="no backend"):
        REGISTRY.create("auto", tmp_path)


@pytest.mark.parametrize("backend", ["saved_model", "onnx", "tflite"])
@pytest.mark.parametrize("batch", [1, 7])
def test_backend_matches_saved_model(repository, backend, batch):
    version_dir = repository / MODEL / "1"
    x = np.random.default_rng(batch).random((batch, 8, 8, 1), dtype=np.float32)
    runtime = REGISTRY.create(backend, version_dir)
    runtime.load()
    try:
        assert runtime.ready
        contract = runtime.metadata()["serving_default"]
        assert contract.inputs["image"].shape == (None, 8, 8, 1)
        assert {k: s.dtype for k, s in contract.outputs.items()} == {
            "logits": "float32", "probabilities": "float32", "class_id": "int64"}
        got = runtime.predict({"image": x})
    finally:
        runtime.unload()
    assert not runtime.ready
    want = saved_model_outputs(version_dir, {"image": x})
    np.testing.assert_array_equal(got["class_id"], want["class_id"])
    for key in ("logits", "probabilities"):
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
        np.testing.assert_allclose(got[key], want[key], atol=1e-5, rtol=1e-5)


def test_load_failure_is_runtime_load_error(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(RuntimeLoadError, match="cannot load") as err:
        OnnxRuntime(tmp_path).load()
    assert err.value.__cause__ is not None
