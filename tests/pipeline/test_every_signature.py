"""A SavedModel's every signature is exported, audited, served and listed: a `tf.Module` saved with
`serving_default` and `score` publishes both, answers gRPC Predict on both, and the manifest and report say
which artifact carries which (converted files carry `serving_default` only)."""

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
    assert carriers["score"]["artifacts"] == ["saved_model"] and carriers["score"]["serve_check"] == "passed"
    assert "saved_model" in carriers["serving_default"]["artifacts"]
    assert len(carriers["serving_default"]["artifacts"]) > 1  # the converted files carry serving_default
    assert manifest["serve_check"]["artifacts"]["saved_model"]["signatures"]["score"]["passed"]
    assert "| score | saved_model | passed |" in (run / "report.md").read_text()
    with ServerProcess(version.parent.parent, "two", "saved_model", ["--rest-port", "-1", "--metrics-port", "-1"],
                       startup_timeout_s=120) as server, PredictClient(server.grpc_target) as client:
        batch = features[:5]
        score = client.predict("two", {"x": batch}, signature_name="score")["score"]
        np.testing.assert_allclose(score, (batch @ WEIGHTS).sum(axis=-1), rtol=1e-5, atol=1e-5)
        probabilities = client.predict("two", {"x": batch})["probabilities"]
        np.testing.assert_allclose(probabilities, tf.nn.softmax(batch @ WEIGHTS).numpy(), rtol=1e-5, atol=1e-6)
