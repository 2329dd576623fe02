"""Forward-only export, SignatureDef read-back, and the backward-node audit (which must fail on
SavedModels built on purpose with gradient, optimizer or training-mode content)."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec, compare_contracts
from tfship.core.errors import AuditError, ContractError
from tfship.core.saved_model import read_signatures
from tfship.signatures.audit import audit_saved_model, raise_if_failed


def test_export_writes_the_contract_and_matches_the_model(exported, splits):
    import tensorflow as tf

    folder, contract, model = exported
    written = read_signatures(folder)
    assert list(written) == ["serving_default"]
    compare_contracts(contract, written["serving_default"], str(folder))
    loaded = tf.saved_model.load(str(folder))
    for batch in (1, 5, 64):
        images = splits.test.images[:batch]
        result = loaded.signatures["serving_default"](image=tf.constant(images))
        logits = model(images, training=False).numpy()
        np.testing.assert_allclose(result["logits"].numpy(), logits, atol=1e-5)
        assert result["class_id"].dtype == tf.int64
        np.testing.assert_array_equal(result["class_id"].numpy(), np.argmax(logits, axis=-1))


def test_audit_passes_and_lists_only_model_weights(exported):
    folder, _, model = exported
    report = raise_if_failed(audit_saved_model(folder, [w.path for w in model.weights]))
    assert {v["name"] for v in report.variables} == {w.path for w in model.weights}
    assert "Conv2D" in report.op_histogram and "MatMul" in report.op_histogram
    assert not any(op.endswith("Grad") or "Apply" in op for op in report.op_histogram)


def _save(module, signature, path):
    import tensorflow as tf

    tf.saved_model.save(module, str(path), signatures={"serving_default": signature})
    return path


def test_audit_fails_on_gradient_and_optimizer_ops(exported, tmp_path):
    import keras
    import tensorflow as tf

    _, _, model = exported
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    module = tf.Module()
    module.weights = [w.value for w in model.weights]
    module.optimizer_state = [v.value for v in optimizer.variables]

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image"),
                                  tf.TensorSpec([None], tf.int64, name="label")])
    def step(image, label):
        with tf.GradientTape() as tape:
            logits = model(image, training=False)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(label, logits, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    report = audit_saved_model(_save(module, step, tmp_path / "with_grad"))
    text = " ".join(report.violations)
    assert not report.passed
    assert "gradient op" in text and "Conv2DBackprop" in text
    assert "variable write" in text
    assert "looks like optimizer or training state" in text  # the SGD iteration counter
    with pytest.raises(AuditError, match="violation"):
        raise_if_failed(report)


def test_audit_fails_on_active_dropout_and_foreign_variables(exported, tmp_path):
    import tensorflow as tf

    _, _, model = exported
    module = tf.Module()
    module.weights = [w.value for w in model.weights]
    module.step = tf.Variable(0, dtype=tf.int64, name="step")

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image")])
    def serve(image):
        noisy = tf.nn.dropout(image, rate=0.5)  # a training-mode layer left active
        return {"logits": model(noisy, training=False)}

    report = audit_saved_model(_save(module, serve, tmp_path / "dropout"), [w.path for w in model.weights])
    text = " ".join(report.violations)
    assert "random op" in text
    assert "variable 'step' is not a model weight" in text


def test_contract_comparison_names_every_difference():
    want = Signature.of("serving_default", (TensorSpec(name="image", dtype="float32", shape=(None, 8, 8, 1)),),
                             (TensorSpec(name="logits", dtype="float32", shape=(None, 10)),
                              TensorSpec(name="class_id", dtype="int64", shape=(None,))))
    got = Signature.of("serving_default", (TensorSpec(name="image", dtype="float64", shape=(None, 8, 8)),),
                            (TensorSpec(name="scores", dtype="float32", shape=(None, 10)),
                             TensorSpec(name="class_id", dtype="int32", shape=(None,))))
    with pytest.raises(ContractError) as error:
        compare_contracts(want, got, "model/1/saved_model.pb")
    message = str(error.value)
    for fragment in ("output 'logits' missing", "unexpected output 'scores'", "input 'image' dtype float64",
                     "input 'image' rank 3", "output 'class_id' dtype int32", "model/1/saved_model.pb"):
        assert fragment in message
