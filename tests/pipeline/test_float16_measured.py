"""The float16 decision belongs to the measured comparison: a Keras attention model with a padding mask (its
masked softmax fills with -1e9, which float16 cannot hold) converts with a warning naming that constant and
publishes its float16 file, because its outputs agree within the float16 bound. Real Keras, converter, LiteRT.
(The refusal side, an overflow that reaches an output, is tests/tflite/test_tflite_failures.py.)"""

from __future__ import annotations

import numpy as np

from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.validate import validate_artifacts
from tfship.tflite.convert import convert_tflite
from tfship.tflite.modes import TfliteMode, TfliteOptions

TOKENS, VOCABULARY = 12, 40


def _masked_attention(folder):
    """tokens int32 [N, 12] (0 = padding) -> Embedding(mask_zero) -> MultiHeadAttention (the padding mask reaches
    its softmax) -> mean -> Dense(3, softmax) `probabilities`."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(11)
    tokens = keras.Input((TOKENS,), dtype="int32", name="tokens")
    embedded = keras.layers.Embedding(VOCABULARY, 16, mask_zero=True)(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(embedded, embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(attended)
    probabilities = keras.layers.Dense(3, activation="softmax")(pooled)
    model = keras.Model(tokens, probabilities)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", lambda t: {"probabilities": model(t, training=False)},
                         input_signature=[tf.TensorSpec([None, TOKENS], tf.int32, name="tokens")])
    archive.write_out(str(folder), verbose=False)
    return folder


def test_masked_attention_publishes_its_float16_file(tmp_path):
    saved_model = _masked_attention(tmp_path / "saved_model")
    rng = np.random.default_rng(2)
    tokens = rng.integers(1, VOCABULARY, (200, TOKENS)).astype(np.int32)
    lengths = rng.integers(3, TOKENS + 1, 200)
    tokens[np.arange(TOKENS)[None, :] >= lengths[:, None]] = 0  # padding after each sequence's length
    # representative rows for LiteRT's check: an all-padding row averages over no token (0/0), NaN in Keras too
    done = convert_tflite(saved_model, tmp_path / "f16.tflite", TfliteOptions(TfliteMode.FLOAT16),
                          {"tokens": tokens[:16]}, 240.0)
    assert done.status == "produced", done.reason
    assert any("65504" in w and "multi_head_attention" in w for w in done.warnings), done.warnings  # softmax fill
    report = validate_artifacts(Artifact("saved_model", "saved_model", "float32", saved_model),
                                [Artifact("tflite_float16", "tflite", "float16", done.path)],
                                read_signatures(saved_model)["serving_default"], {"tokens": tokens}, None,
                                load_config().parity)
    row = report.rows[1]
    assert row.passed, row.reason
    assert 0 < row.outputs[0].max_abs_error < 1e-2, row.outputs[0]
