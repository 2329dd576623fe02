"""Step kinds, freezing, debug switches and sparse embedding gradients through the real training loop
(`train_model`: one traced, XLA-compiled step), then the forward-only export and its audit."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.errors import StageError
from tfship.pipeline.config import load_config
from tfship.pipeline.data.splits import load_split_arrays
from tfship.pipeline.training.train import TrainInputs, train_model

FAST = {"train.epochs": 1, "train.jit_compile": True, "train.tensorboard": False, "model.kind": "mlp",
        "model.hidden_units": [32]}


def _train(tmp_path, overrides):
    config = load_config(None, FAST | overrides)
    splits = load_split_arrays(config.data, config.run.seed)
    return train_model(TrainInputs(config, splits, tmp_path / "checkpoints")), splits


def log_of_zero_loss(y_true, y_pred, model):
    """A user loss that is -inf: log(0) (check-numerics test)."""
    import tensorflow as tf

    return tf.reduce_mean(tf.math.log(y_pred * 0.0))


def _calls():
    import tensorflow as tf

    global _CALLS
    if "_CALLS" not in globals():
        _CALLS = tf.Variable(0.0, trainable=False, name="loss_calls")
    return _CALLS


def late_inf_loss(y_true, y_pred, model):
    """Cross-entropy plus log(5 - calls): finite for 4 calls, -inf at the 5th (check-numerics test)."""
    import keras
    import tensorflow as tf

    calls = _calls()
    calls.assign_add(1.0)
    ce = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True))
    return ce + tf.math.log(5.0 - calls)


def hinge_loss(y_true, y_pred, model):
    """A user loss: multi-class hinge on the logits, mean over the batch."""
    import keras

    return keras.ops.mean(keras.losses.categorical_hinge(keras.ops.one_hot(y_true, 10), y_pred))


def _teacher(path):
    import keras

    keras.utils.set_random_seed(5)
    teacher = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    teacher.save(path)
    return path


KINDS = {
    "multi_loss": {"train.step.losses": {"cross_entropy": 1.0, "logit_l2": 0.01, "confidence_penalty": 0.1}},
    "gradient_penalty": {"train.step.penalty_weight": 0.1},
    "adversarial": {"train.step.epsilon": 0.05},
    "custom_loss": {"train.step.loss": "tests.pipeline.test_train_kinds_e2e:hinge_loss"},
    "distillation": {},
    "factory": {"train.step.factory": "tests.pipeline.test_step_kinds:class_weighted_factory"},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_step_kind_trains_once_traced_under_xla_and_exports_forward_only(tmp_path, kind):
    from tfship.signatures.audit import audit_saved_model, raise_if_failed
    from tfship.signatures.export import build_classifier_module, classifier_contract, export_saved_model

    overrides = {"train.step.kind": kind, **KINDS[kind]}
    if kind == "distillation":
        overrides["train.step.teacher"] = str(_teacher(tmp_path / "teacher.keras"))
    result, splits = _train(tmp_path, overrides)
    summary = result.summary()
    assert result.train_step_traces == 1 and result.jit_compile is True
    assert summary["step_kind"]["kind"] == ("class_weighted" if kind == "factory" else kind)
    for name, value in summary["step_kind"]["last"].items():
        assert np.isfinite(value), name
    if kind == "multi_loss":
        assert {"grad_norm/cross_entropy", "grad_norm/logit_l2", "grad_norm/confidence_penalty"} <= \
            set(summary["step_kind"]["last"])
    assert result.history[-1].loss < 2.31  # learned something in one epoch (chance is ln 10 = 2.303)
    contract = classifier_contract("image", (8, 8, 1), len(splits.class_names))
    folder = tmp_path / "export" / "1"
    export_saved_model(build_classifier_module(result.model, contract), contract, folder)
    report = raise_if_failed(audit_saved_model(folder, [w.path for w in result.model.weights]))
    assert report.passed


def test_check_numerics_names_the_first_op_producing_inf_with_its_stack(tmp_path):
    with pytest.raises(StageError) as caught:
        _train(tmp_path, {"train.step.kind": "custom_loss", "train.check_numerics": True,
                          "train.step.loss": "tests.pipeline.test_train_kinds_e2e:log_of_zero_loss"})
    message = str(caught.value)
    assert "check_numerics: op 'Log' produced NaN or Inf" in message and "at step 1" in message
    assert "test_train_kinds_e2e.py" in message  # where the op was created (the user's loss)
    import tensorflow as tf

    # switched off again afterwards: the same op on inf no longer raises
    assert np.isneginf(float(tf.function(lambda: tf.math.log(tf.constant(0.0)))()))


def test_check_numerics_stays_in_the_traced_step_after_the_first_steps(tmp_path):
    # The first call of the step (tracing, then restored) is call 1; loop step k is call k + 1: log(0) at step 4.
    _calls().assign(0.0)  # created and reset outside the step, so the step itself creates no variable
    with pytest.raises(StageError, match=r"op 'Log' produced NaN or Inf \(-Inf values, output 0\) at step 4; "
                                         r"created at: .*test_train_kinds_e2e.py"):
        _train(tmp_path, {"train.step.kind": "custom_loss", "train.check_numerics": True,
                          "train.step.loss": "tests.pipeline.test_train_kinds_e2e:late_inf_loss"})


def test_assert_inputs_passes_on_clean_data_and_is_reported(tmp_path):
    result, _ = _train(tmp_path, {"train.assert_inputs": True, "train.jit_compile": False})
    assert result.summary()["debug"]["assert_inputs"] is True and result.train_step_traces == 1


def test_input_assertions_name_the_failed_check():
    import tensorflow as tf

    from tfship.pipeline.training.train_checks import input_assertions

    spec = (tf.TensorSpec([None, 8, 8, 1], tf.float32), tf.TensorSpec([None], tf.int64))
    check = input_assertions("classification", 10, spec)
    good = np.zeros((2, 8, 8, 1), np.float32)
    check(tf.constant(good), tf.constant([0, 9], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="label not below 10 classes"):
        check(tf.constant(good), tf.constant([0, 10], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf in the inputs"):
        check(tf.constant(np.full((2, 8, 8, 1), np.nan, np.float32)), tf.constant([0, 1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="input example shape"):
        check(tf.constant(np.zeros((2, 8, 7, 1), np.float32)), tf.constant([0, 1], tf.int64))


def frozen_block_factory(input_shape, num_classes):
    """A nested `block` (Dense + BatchNormalization) feeding a trainable head."""
    import keras

    keras.utils.set_random_seed(2)
    block = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(16, name="block_dense"),
                              keras.layers.BatchNormalization(name="block_bn")], name="block")
    inputs = keras.Input(shape=input_shape, name="image")
    hidden = keras.layers.Dense(16, activation="relu", name="head_dense")(block(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(hidden))


def _initial_weights(factory, splits):
    model = factory(splits.train.images.shape[1:], len(splits.class_names))
    return {w.path: w.numpy().copy() for w in model.weights}


def test_frozen_block_is_bit_identical_has_no_slots_and_batch_norm_stays_in_inference_mode(tmp_path):
    overrides = {"model.factory": "tests.pipeline.test_train_kinds_e2e:frozen_block_factory",
                 "train.freeze": ["block"], "train.epochs": 2}
    result, splits = _train(tmp_path, overrides)
    before = _initial_weights(frozen_block_factory, splits)
    after = {w.path: w.numpy() for w in result.model.weights}
    frozen = result.summary()["frozen"]
    assert frozen["layers"] == ["block"] and len(frozen["weights"]) == 6  # kernel, bias, gamma, beta, mean, var
    for path in frozen["weights"]:
        assert np.array_equal(before[path], after[path]), path  # moving statistics included
    assert not np.array_equal(before["head_dense/kernel"], after["head_dense/kernel"])
    assert frozen["optimizer_slots_for_frozen_weights"] == []
    # Adam: iterations + learning rate + 2 slots for each of the 4 trainable weights (head and logits).
    assert frozen["optimizer_variables"] == 2 + 2 * 4


def test_freeze_by_pattern_on_the_cnn_and_unknown_pattern_is_named(tmp_path):
    from tfship.core.errors import ConfigError

    result, _ = _train(tmp_path, {"model.kind": "cnn", "model.filters": [8, 8], "train.freeze": ["conv*"]})
    assert result.summary()["frozen"]["layers"] == ["conv0", "conv1"]
    with pytest.raises(ConfigError, match=r"'nope\*' matches no layer"):
        _train(tmp_path / "b", {"train.freeze": ["nope*"]})


def test_large_embedding_trains_with_indexed_slices_gradients(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 256)
    tokens = rng.integers(3, 50_000, (256, 8)).astype(np.int32)
    tokens[:, 0] = labels + 1
    np.savez(tmp_path / "text.npz", tokens=tokens, label=labels)
    result, _ = _train(tmp_path, {"data.source": "npz", "data.path": str(tmp_path / "text.npz"),
                                  "data.batch_size": 32, "model.kind": "text", "model.vocab_size": 50_000,
                                  "model.embedding_dim": 16, "train.optimizer": "sgd", "train.momentum": 0.0,
                                  "train.clip_global_norm": 0})
    summary = result.summary()
    assert summary["sparse_gradients"] == {"embedding/embeddings": "IndexedSlices"}
    assert summary["sparse_update_ops"] == ["ResourceScatterSub"]  # applied row by row, never densified
    assert result.train_step_traces == 1
    from tfship.pipeline.orchestration.report import training_details

    assert "  - sparse gradient: `embedding/embeddings` trains with IndexedSlices (rows touched only), applied " \
           "sparsely (ResourceScatterSub)" in training_details(summary)


def test_sparse_gradient_is_reported_even_when_clipping_densifies_the_update(tmp_path):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 128)
    np.savez(tmp_path / "t.npz", tokens=rng.integers(1, 5000, (128, 4)).astype(np.int32), label=labels)
    result, _ = _train(tmp_path, {"data.source": "npz", "data.path": str(tmp_path / "t.npz"), "data.batch_size": 32,
                                  "model.kind": "text", "model.vocab_size": 5000, "model.embedding_dim": 8})
    summary = result.summary()  # Adam + clip_global_norm = 5: the tape's gradient is sparse, the update dense
    assert summary["sparse_gradients"] == {"embedding/embeddings": "IndexedSlices"}
    assert summary["sparse_update_ops"] == []
