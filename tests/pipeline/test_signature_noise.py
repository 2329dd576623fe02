"""A SavedModel's other signatures are judged like `serving_default`: the SavedModel's own noise on each (its
answers between batch sizes and across repeated calls) is measured and allowed on top of the bound, so a
difference the SavedModel shows against itself never fails a signature; a real miss names that noise, the
batch sizes and the setting to change.

The smallest model that shows it: a `tf.Module` whose `score` signature moves by a few 1e-4 with the batch
size (as a kernel whose reduction order follows the batch does), judged against itself as a second artifact.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact
from tfship.pipeline.gate.compare import compare_outputs, failures
from tfship.pipeline.gate.signatures import runner_for, validate_other_signatures
from tfship.pipeline.gate.validate import run_batched, tolerance_for

WEIGHTS = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
WOBBLE = 3e-4  # per step of (batch size mod 3): 30x validate.float32.atol


class BatchWobble(tf.Module):
    """`serving_default`: x f32 [-1, 4] -> logits f32 [-1, 3]; `score`: x -> score f32 [-1], which differs by
    up to 2 * WOBBLE (plus `offset`) between batch sizes.
    """

    def __init__(self, offset: float = 0.0):
        super().__init__()
        self.w = tf.Variable(WEIGHTS)
        self.offset = offset

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def classify(self, x):
        return {"logits": tf.matmul(x, self.w)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def score(self, x):
        wobble = WOBBLE * tf.cast(tf.shape(x)[0] % 3, tf.float32)
        return {"score": tf.reduce_sum(tf.matmul(x, self.w), axis=-1) + wobble + self.offset}


def _saved(folder, offset: float = 0.0):
    module = BatchWobble(offset)
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.classify, "score": module.score})
    return folder


INPUTS = {"x": np.random.default_rng(5).standard_normal((20, 4)).astype(np.float32)}


def test_the_saved_models_own_noise_on_another_signature_never_fails_it(tmp_path):
    reference = Artifact(SAVED_MODEL, "saved_model", "float32", _saved(tmp_path / "sm"))
    itself = Artifact("itself", "saved_model", "float32", reference.path)
    settings = ValidateSection()
    judged = validate_other_signatures(reference, [itself], INPUTS, settings)
    noise = judged.noise["score"]["score"]
    assert noise.max_abs >= 2 * WOBBLE * 0.9 and noise.batch_sizes[0] != noise.batch_sizes[1], noise
    assert judged.verdicts["itself"]["score"].passed, judged.verdicts
    # without the allowance the same answers miss: batch 1 against the SavedModel's batch-20 answers
    runner = runner_for(reference, "score")
    expected = run_batched(runner, INPUTS, 20)
    assert failures(compare_outputs(run_batched(runner, INPUTS, 1), expected, tolerance_for("float32", settings)))
    runner.close()
    recorded = json.loads(json.dumps(judged.to_json()))["signature_noise"]  # parity.json's record of it
    assert recorded["score"]["score"]["max_abs"] == noise.max_abs and "serving_default" not in recorded


def test_a_miss_beyond_the_noise_names_it_the_batch_sizes_and_the_settings(tmp_path):
    reference = Artifact(SAVED_MODEL, "saved_model", "float32", _saved(tmp_path / "sm"))
    shifted = Artifact("shifted", "saved_model", "float32", _saved(tmp_path / "shifted", offset=1e-2))
    verdict = validate_other_signatures(reference, [shifted], INPUTS, ValidateSection()).verdicts["shifted"]["score"]
    assert not verdict.passed and verdict.max_abs_error > 9e-3, verdict
    reason = verdict.reason
    assert "output 'score'" in reason and "the SavedModel itself differs by up to" in reason, reason
    assert "between batch" in reason and "validate.float32.atol" in reason and "validate.noise_multiplier" in reason, reason
