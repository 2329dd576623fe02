"""A SavedModel's every signature is exported, audited, converted, judged, served and listed: a `tf.Module`
saved with `serving_default` and `score` publishes both in the SavedModel, the float32 TFLite file and ONNX
(`model.onnx` and `model.score.onnx`), answers gRPC Predict on both from each, and the manifest and report say
which file carries which; the int8 TFLite file carries `serving_default` alone and its conversion says why,
which the manifest and report then name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tests.pipeline.conftest import run_tfship

WEIGHTS = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)


class TwoSignatures(tf.Module):
    """`serving_default`: x f32 [-1, 4] -> probabilities f32 [-1, 3]; `score`: x -> score f32 [-1]."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(WEIGHTS)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def classify(self, x):
        return {"probabilities": tf.nn.softmax(tf.matmul(x, self.w))}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def score(self, x):
        return {"score": tf.reduce_sum(tf.matmul(x, self.w), axis=-1)}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_signatures")
    module = TwoSignatures()
    tf.saved_model.save(module, str(root / "source"), signatures={"serving_default": module.classify,
                                                                  "score": module.score})
    features = np.random.default_rng(7).standard_normal((60, 4)).astype(np.float32)
    np.savez(root / "data.npz", x=features, y=np.argmax(features @ WEIGHTS, axis=-1))
    completed = run_tfship("run", "--model", str(root / "source"), "--data", str(root / "data.npz"),
                           "--runs-dir", str(root / "runs"), "--repository", str(root / "models"),
                           "--set", "run.model_name=two", "--set", 'convert.tflite_modes=["float32"]')
    assert completed.returncode in (0, 3), completed.stdout[-3000:] + completed.stderr[-3000:]
    (run,) = (root / "runs").iterdir()
    return root / "models" / "two" / "1", run, features


@pytest.mark.slow
def test_both_signatures_are_published_served_and_listed(published):
    from tfship.serving.launcher import ServerProcess
    from tfship.serving.tfs.client import PredictClient

    version, run, features = published
    manifest = json.loads((version / "manifest.json").read_text())
    assert sorted(manifest["signature_def"]) == ["score", "serving_default"]
    carriers = manifest["signatures"]
    assert carriers["score"]["artifacts"] == ["saved_model", "onnx", "tflite_float32"], carriers
    assert carriers["score"]["files"] == {"saved_model": "saved_model.pb", "onnx": "model.score.onnx",
                                          "tflite_float32": "model.tflite"}, carriers
    assert carriers["score"]["serve_check"] == "passed", carriers
    assert carriers["serving_default"]["artifacts"] == ["saved_model", "onnx", "tflite_float32"]
    assert (version / "model.score.onnx").is_file()
    for artifact in ("saved_model", "onnx", "tflite_float32"):
        assert manifest["serve_check"]["artifacts"][artifact]["signatures"]["score"]["passed"]
    for artifact in ("onnx", "tflite_float32"):
        assert manifest["parity"]["signatures"][artifact]["score"]["passed"]
    assert manifest["parity"]["signature_noise"]["score"]["score"]["max_abs"] >= 0.0
    report = (run / "report.md").read_text()
    assert "| score | saved_model, onnx, tflite_float32 | passed | model.score.onnx, model.tflite, saved_model.pb | - |" \
        in report, report
    batch = features[:5]
    for backend in ("saved_model", "onnx", "tflite"):
        with ServerProcess(version.parent.parent, "two", backend, ["--rest-port", "-1", "--metrics-port", "-1"],
                           startup_timeout_s=120) as server, PredictClient(server.grpc_target) as client:
            score = client.predict("two", {"x": batch}, signature_name="score")["score"]
            np.testing.assert_allclose(score, (batch @ WEIGHTS).sum(axis=-1), rtol=1e-5, atol=1e-5)
            probabilities = client.predict("two", {"x": batch})["probabilities"]
            np.testing.assert_allclose(probabilities, tf.nn.softmax(batch @ WEIGHTS).numpy(), rtol=1e-5, atol=1e-6)


def test_int8_files_carry_serving_default_alone_and_the_carriers_say_so():
    from tfship.core.contract import Signature, TensorSpec
    from tfship.pipeline.conversion.artifacts import SignatureCarriage
    from tfship.pipeline.gate.serve_check import ServeCheckResult
    from tfship.pipeline.orchestration.outcomes import ArtifactOutcome, signature_carriers
    from tfship.pipeline.orchestration.reasons import first_line
    from tfship.tflite.modes import TfliteMode
    from tfship.tflite.worker import INT8_SIGNATURES_NOTE, carried_signatures

    spec = Signature.of("score", (TensorSpec("x", "float32", (None, 4)),), (TensorSpec("score", "float32", (None,)),))
    signatures = {"serving_default": spec, "score": spec}
    assert carried_signatures(signatures, TfliteMode.INT8) == ("serving_default",)
    assert carried_signatures(signatures, TfliteMode.FLOAT16) == ("serving_default", "score")
    outcomes = [ArtifactOutcome(a, "published", "", "", "", False) for a in ("saved_model", "onnx", "tflite_int8")]
    served = ServeCheckResult({"saved_model": {"passed": True, "reason": "", "signatures": {
        "score": {"passed": False, "reason": "output 'score' differs"}}}, "onnx": {"passed": True, "reason": ""},
        "tflite_int8": {"passed": True, "reason": ""}})
    carried = {"saved_model": ("score", "serving_default"), "onnx": ("serving_default",),
               "tflite_int8": SignatureCarriage({"serving_default": "model_int8.tflite"},
                                                {"score": INT8_SIGNATURES_NOTE})}
    carriers = signature_carriers(["score", "serving_default"], "serving_default", outcomes, served, carried)
    assert carriers["score"]["artifacts"] == ["saved_model"]
    assert carriers["score"]["serve_check"] == "saved_model: output 'score' differs"
    assert carriers["score"]["left_out"] == {"tflite_int8": first_line(INT8_SIGNATURES_NOTE, 160)}
    assert carriers["score"]["note"].startswith("not in tflite_int8: int8 TFLite is calibrated on serving_default")
    assert carriers["serving_default"] == {"artifacts": ["saved_model", "onnx", "tflite_int8"],
                                           "files": {"tflite_int8": "model_int8.tflite"}, "left_out": {},
                                           "serve_check": "passed", "note": ""}


@pytest.mark.slow
def test_the_int8_conversion_names_each_signature_its_file_does_not_carry(tmp_path):
    from tfship.core.saved_model import read_signatures
    from tfship.pipeline.config import ConvertSection
    from tfship.pipeline.conversion.artifacts import Artifact, ConversionJob, ConversionStatus
    from tfship.pipeline.gate.signatures import signature_carriage
    from tfship.tflite.formats import tflite_converter
    from tfship.tflite.worker import INT8_SIGNATURES_NOTE

    module = TwoSignatures()
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serving_default": module.classify,
                                                                 "score": module.score})
    features = np.random.default_rng(7).standard_normal((40, 4)).astype(np.float32)
    job = ConversionJob(tmp_path / "1", read_signatures(tmp_path / "1")["serving_default"], ConvertSection(),
                        {"x": features}, {"x": features[:8]})
    outcome = tflite_converter("int8")(job)
    assert outcome.status == ConversionStatus.PRODUCED, outcome.reason
    assert outcome.signatures_left_out == {"score": INT8_SIGNATURES_NOTE}
    carriage = signature_carriage(Artifact("tflite_int8", "tflite", "int8", tmp_path / "1" / "model_int8.tflite"),
                                  ["score", "serving_default"], outcome.__dict__)
    assert carriage.files == {"serving_default": "model_int8.tflite"}
    assert carriage.left_out == {"score": INT8_SIGNATURES_NOTE}


@pytest.mark.slow
def test_keras_export_of_a_swish_model_publishes_every_artifact(tmp_path):
    """`model.export()` of Dense + swish: its custom-gradient functions once failed the audit (exit 2)."""
    import keras

    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(3, activation="swish", name="dense_swish")(inputs))
    model.export(str(tmp_path / "swish"), verbose=False)
    features = np.random.default_rng(8).standard_normal((40, 4)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=features)
    completed = run_tfship("run", "--model", str(tmp_path / "swish"), "--data", str(tmp_path / "data.npz"),
                           "--runs-dir", str(tmp_path / "runs"), "--repository", str(tmp_path / "models"),
                           "--set", 'convert.tflite_modes=["float32"]')
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    manifest = json.loads((tmp_path / "models" / "swish" / "1" / "manifest.json").read_text())
    assert manifest["audit"]["passed"] and sorted(manifest["signature_def"]) == ["serve", "serving_default"]
    assert [a["artifact"] for a in manifest["artifacts"] if a["status"] == "published"] == [
        "saved_model", "onnx", "tflite_float32"]
    assert manifest["signatures"]["serve"]["artifacts"][0] == "saved_model"
