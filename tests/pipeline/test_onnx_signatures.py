"""ONNX carries every signature, one file each: a `tf.Module` saved with `serving_default`, `score` and `gamma`
(Lgamma, which tf2onnx cannot convert) gets `model.onnx` and `model.score.onnx`; `gamma` is left out with a
reason naming the op, without affecting the others. Each file is proven against the SavedModel's same signature
by the parity gate's comparison; one that misses is set aside with its reason, the rest stays; the `onnx`
serving backend serves each file under its signature name.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfship.pipeline.config import ConvertSection, ValidateSection
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact, ConversionJob, ConversionStatus
from tfship.pipeline.gate.signatures import SET_ASIDE, signature_carriage, validate_other_signatures
from tfship.pipeline.orchestration.outcomes import ArtifactOutcome, signature_carriers
from tfship.pipeline.orchestration.reasons import first_line
from tfship.serving.runtimes.onnx import OnnxRuntime, signature_file_name

pytestmark = pytest.mark.slow  # three tf2onnx child processes (about 30 s on a quiet machine)

WEIGHTS = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
INPUTS = {"x": np.random.default_rng(9).standard_normal((24, 4)).astype(np.float32)}


class ThreeSignatures(tf.Module):
    """x f32 [-1, 4]: `serving_default` -> probabilities [-1, 3]; `score` -> score [-1]; `gamma` -> lgamma(x)."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(WEIGHTS)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def classify(self, x):
        return {"probabilities": tf.nn.softmax(tf.matmul(x, self.w))}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def score(self, x):
        return {"score": tf.reduce_sum(tf.matmul(x, self.w), axis=-1)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def gamma(self, x):
        return {"lgamma": tf.math.lgamma(tf.abs(x) + 1.0)}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from tfship.core.saved_model import read_signatures
    from tfship.onnx_format.formats import convert_onnx

    version = tmp_path_factory.mktemp("three") / "1"
    module = ThreeSignatures()
    tf.saved_model.save(module, str(version), signatures={"serving_default": module.classify, "score": module.score,
                                                          "gamma": module.gamma})
    contract = read_signatures(version)["serving_default"]
    job = ConversionJob(version, contract, ConvertSection(), {}, {"x": INPUTS["x"][:8]})
    return version, convert_onnx(job)


def test_each_signature_gets_its_own_file_and_one_that_fails_is_named_with_its_cause(converted):
    version, outcome = converted
    assert outcome.status == ConversionStatus.PRODUCED, outcome.reason
    assert outcome.signature_files == {"score": "model.score.onnx"}
    assert (version / "model.onnx").is_file() and (version / "model.score.onnx").is_file()
    assert not (version / "model.gamma.onnx").exists()
    reason = first_line(outcome.signatures_left_out["gamma"])
    assert "Lgamma" in reason and "model.gamma.onnx" in reason and ".model.gamma." not in reason, reason
    assert signature_file_name("serving_default") == "model.onnx" and signature_file_name("a/b") is None


def test_the_onnx_backend_serves_every_signature_file(converted):
    version, _ = converted
    runtime = OnnxRuntime(version)
    runtime.load()
    try:
        assert sorted(runtime.metadata()) == ["score", "serving_default"]
        assert list(runtime.metadata()["score"].outputs) == ["score"]
        score = runtime.predict({"x": INPUTS["x"][:5]}, "score")["score"]
        np.testing.assert_allclose(score, (INPUTS["x"][:5] @ WEIGHTS).sum(axis=-1), rtol=1e-5, atol=1e-5)
        assert list(runtime.predict({"x": INPUTS["x"][:2]})) == ["probabilities"]
    finally:
        runtime.unload()


def test_a_signature_file_that_misses_is_set_aside_and_the_rest_stays(converted, tmp_path):
    import shutil

    import onnx
    from onnx import numpy_helper

    version, outcome = converted
    copy = tmp_path / "1"
    shutil.copytree(version, copy)
    reference = Artifact(SAVED_MODEL, "saved_model", "float32", copy)
    onnx_artifact = Artifact("onnx", "onnx", "float32", copy / "model.onnx")
    judged = validate_other_signatures(reference, [onnx_artifact], INPUTS, ValidateSection())
    assert judged.verdicts["onnx"]["score"].passed, judged.verdicts
    assert judged.verdicts["onnx"]["score"].max_abs_error < 1e-5

    model = onnx.load(str(copy / "model.score.onnx"))  # the same graph, its weights a little off
    for initializer in model.graph.initializer:
        value = numpy_helper.to_array(initializer)
        if value.dtype == np.float32 and value.size == WEIGHTS.size:
            initializer.CopyFrom(numpy_helper.from_array(value + np.float32(0.01), initializer.name))
    onnx.save(model, str(copy / "model.score.onnx"))
    verdict = validate_other_signatures(reference, [onnx_artifact], INPUTS, ValidateSection()).verdicts["onnx"]["score"]
    assert not verdict.passed and verdict.set_aside == f"{SET_ASIDE}/model.score.onnx", verdict
    assert not (copy / "model.score.onnx").exists() and (copy / "model.onnx").is_file()

    names = ["gamma", "score", "serving_default"]
    carriage = signature_carriage(onnx_artifact, names, outcome.__dict__, {"score": verdict})
    assert carriage.files == {"serving_default": "model.onnx"}
    assert carriage.left_out["score"].startswith("parity: ") and "output 'score'" in carriage.left_out["score"]
    outcomes = [ArtifactOutcome(a, "published", "", "", "", False) for a in (SAVED_MODEL, "onnx")]
    carried = {SAVED_MODEL: signature_carriage(reference, names), "onnx": carriage}
    carriers = signature_carriers(names, "serving_default", outcomes, None, carried)
    assert carriers["score"]["artifacts"] == [SAVED_MODEL] and carriers["score"]["files"] == {
        SAVED_MODEL: "saved_model.pb"}
    assert "Lgamma" in carriers["gamma"]["left_out"]["onnx"] and "\n" not in carriers["gamma"]["note"]
    assert carriers["serving_default"]["files"] == {SAVED_MODEL: "saved_model.pb", "onnx": "model.onnx"}
