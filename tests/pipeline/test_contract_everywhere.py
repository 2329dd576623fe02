"""One contract everywhere: an unknown-rank input and a scalar input read the same through every reader.

A SavedModel whose `serving_default` takes `x` float32 of unknown rank and `s` float32 scalar (outputs
`y = x * s`, unknown rank, and `t = s + 1`, scalar) goes through the export stage, the audit, the ONNX
and TFLite conversions, `tfship inspect`, every runtime's metadata, GetModelMetadata over gRPC and a
Predict through each backend. Everywhere `x` is `None` (unknown rank) and `s` is `()` (a scalar): TFLite
and tf2onnx both write an unknown rank as a scalar, so the runtimes report the SavedModel's contract.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec
from tfship.core.saved_model import from_signature_def, read_signatures, to_signature_def

EXPECTED = Signature.of(
    "serving_default",
    (TensorSpec(name="s", dtype="float32", shape=()), TensorSpec(name="x", dtype="float32", shape=None)),
    (TensorSpec(name="t", dtype="float32", shape=()), TensorSpec(name="y", dtype="float32", shape=None)),
)
BACKENDS = ("saved_model", "onnx", "tflite")
FEED = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.array(2.0, np.float32)}


def _same(signature: Signature) -> dict:
    """What must agree: per alias, dtype and shape (tensor names differ by reader and are not compared)."""
    return {side: {k: (v.dtype, v.shape) for k, v in getattr(signature, side).items()}
            for side in ("inputs", "outputs")}


def _source_model(folder):
    import tensorflow as tf

    class Scale(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec(None, tf.float32, name="x"),
                                      tf.TensorSpec([], tf.float32, name="s")])
        def serve(self, x, s):
            return {"y": x * s, "t": s + 1.0}

    module = Scale()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def version_dir(tmp_path_factory):
    from tfship.onnx_format.convert import convert_to_onnx
    from tfship.signatures.audit import audit_saved_model, raise_if_failed
    from tfship.signatures.export import build_savedmodel_module, export_saved_model
    from tfship.tflite.convert import convert_tflite
    from tfship.tflite.modes import TfliteOptions

    root = tmp_path_factory.mktemp("shapes")
    _source_model(root / "source")
    contract = read_signatures(root / "source")["serving_default"]
    version = root / "repo" / "scale" / "1"
    export_saved_model(build_savedmodel_module(root / "source", contract), contract, version)
    raise_if_failed(audit_saved_model(version))
    convert_to_onnx(version, version / "model.onnx", contract, 17, FEED, timeout_s=300)
    tflite = convert_tflite(version, version / "model.tflite", TfliteOptions.from_mapping({"mode": "float32"}),
                            None, timeout_s=300)
    assert tflite.status == "produced", tflite.reason
    return version


@pytest.mark.slow
def test_export_audit_and_reader_agree(version_dir):
    from tfship.signatures.audit import audit_saved_model

    written = read_signatures(version_dir)["serving_default"]
    assert _same(written) == _same(EXPECTED)
    assert audit_saved_model(version_dir).signatures == ("serving_default",)
    assert _same(Signature.from_json(written.to_json())) == _same(EXPECTED)  # manifest form
    assert {t["name"]: t["shape"] for t in written.to_json()["inputs"]} == {"x": None, "s": []}
    assert _same(from_signature_def("serving_default", to_signature_def(written))) == _same(EXPECTED)


@pytest.mark.slow
def test_inspect_reports_the_same_shapes(version_dir):
    from tfship.pipeline.api.inspection import describe

    described = describe(version_dir)["signatures"]["serving_default"]
    assert {t["name"]: t["shape"] for t in described["inputs"]} == {"s": [], "x": None}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_runtime_serves_the_same_contract_and_answer(version_dir, backend):
    from tfship.serving.runtimes import REGISTRY

    runtime = REGISTRY.create(backend, version_dir)
    runtime.load()
    try:
        assert _same(runtime.metadata()["serving_default"]) == _same(EXPECTED)
        outputs = runtime.predict(dict(FEED))
    finally:
        runtime.unload()
    np.testing.assert_allclose(outputs["y"], FEED["x"] * 2.0)
    assert np.asarray(outputs["t"]).shape == () and float(outputs["t"]) == 3.0


@pytest.mark.slow
def test_grpc_metadata_and_predict_agree_for_every_backend(version_dir):
    from tfship.serving.launcher import ServerProcess
    from tfship.serving.tfs.client import PredictClient

    for backend in BACKENDS:
        with ServerProcess(version_dir.parent.parent, "scale", backend, ["--rest-port", "-1", "--metrics-port", "-1"],
                           startup_timeout_s=120) as server, PredictClient(server.grpc_target) as client:
            assert _same(client.metadata("scale")["serving_default"]) == _same(EXPECTED), backend
            got = client.predict("scale", dict(FEED))
            np.testing.assert_allclose(got["y"], FEED["x"] * 2.0)
            assert got["t"].shape == () and float(got["t"]) == 3.0
