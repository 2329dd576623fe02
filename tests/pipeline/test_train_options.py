"""Training options on real data, in process: models, optimizers and schedules, accumulation,
mixed precision, gradient checkpointing, XLA choice and fallback, non-finite stops, determinism,
eager debugging, early stopping, TensorBoard events and in-process resume."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.errors import ConfigError, StageError
from tfship.pipeline.config import load_config
from tfship.pipeline.data.splits import load_split_arrays
from tfship.pipeline.training.train import TrainInputs, train_model

FAST = {"train.epochs": 1, "train.jit_compile": False, "train.tensorboard": False}


def _train(tmp_path, overrides=None, splits=None, **inputs):
    config = load_config(None, FAST | (overrides or {}))
    splits = splits if splits is not None else load_split_arrays(config.data, config.run.seed)
    return train_model(TrainInputs(config, splits, tmp_path / "checkpoints", **inputs))


# --- user factories (model.factory = "tests.pipeline.test_train_options:<name>") ---------------
def small_factory(input_shape, num_classes, width=16):
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    hidden = keras.layers.Dense(width, activation="relu", name="user_dense")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(hidden))


def not_xla_factory(input_shape, num_classes):
    import keras
    import tensorflow as tf

    class HostCall(keras.layers.Layer):
        def call(self, x):
            zero = tf.numpy_function(lambda a: np.zeros_like(a), [x], tf.float32, stateful=False)
            return x + tf.stop_gradient(tf.reshape(zero, tf.shape(x)))

    inputs = keras.Input(shape=input_shape, name="image")
    hidden = HostCall(name="host_call")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(hidden))


def exploding_factory(input_shape, num_classes):
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    hidden = keras.layers.Dense(8, name="first")(keras.layers.Flatten()(inputs))
    bad = keras.layers.Dense(num_classes, name="exploding", kernel_initializer=keras.initializers.Constant(np.inf))
    return keras.Model(inputs, bad(hidden))


# --- tests ---------------------------------------------------------------------------------------
def test_default_cnn_is_traced_once_and_checkpointed(tmp_path):
    result = _train(tmp_path, {"train.epochs": 2})
    assert result.train_step_traces == 1 and result.steps == 2 * (1168 // 64)
    assert result.history[-1].validation_accuracy > 0.6
    assert result.checkpoint_path.with_suffix(".index").exists()
    assert "dropped" in result.summary()["partial_batch"]


def test_mlp_with_normalization_adamw_cosine_warmup_and_accumulation(tmp_path):
    result = _train(tmp_path, {"model.kind": "mlp", "model.normalize": True, "model.hidden_units": [64],
                               "train.optimizer": "adamw", "train.schedule": "cosine", "train.warmup_steps": 3,
                               "train.accumulation_steps": 2, "train.epochs": 6, "train.learning_rate": 0.01})
    model = result.model
    assert model.get_layer("normalize").mean.shape[-1] == 1  # adapted per channel, part of the model
    # 18 steps per epoch x 6 epochs, 2 micro-steps per update: 54 optimizer updates.
    assert result.summary()["optimizer_updates"] == 54
    assert result.history[-1].loss < result.history[0].loss and result.test_accuracy > 0.8
    assert result.summary()["accumulation_steps"] == 2


def test_text_model_on_token_ids(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    tokens = rng.integers(3, 50, (400, 12)).astype(np.int32)
    tokens[:, 0] = labels + 1  # the first token gives the class away
    path = tmp_path / "text.npz"
    np.savez(path, tokens=tokens, label=labels)
    config = load_config(None, FAST | {"data.source": "npz", "data.path": str(path), "data.batch_size": 32,
                                       "model.kind": "text", "model.vocab_size": 64, "train.epochs": 4,
                                       "train.learning_rate": 0.01})
    splits = load_split_arrays(config.data, config.run.seed)
    assert splits.input_name == "tokens" and splits.train.images.dtype == np.int32
    result = train_model(TrainInputs(config, splits, tmp_path / "ck"))
    assert result.model.inputs[0].dtype == "int32" and result.test_accuracy > 0.9


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_float32_variables_and_outputs(tmp_path, policy):
    result = _train(tmp_path, {"train.mixed_precision": policy, "train.optimizer": "sgd",
                               "train.learning_rate": 0.05, "train.tensorboard": True,
                               "train.log_every_steps": 1}, tensorboard_dir=tmp_path / "tb")
    model = result.model
    assert model.get_layer("conv0").compute_dtype == policy.split("_")[1]
    assert all(w.dtype == "float32" for w in model.weights)
    assert model(np.zeros((2, 8, 8, 1), np.float32)).dtype == "float32"
    assert result.history[-1].validation_accuracy > 0.3
    scales = _scalars(tmp_path / "tb" / "train", "loss_scale")
    assert (scales[-1] > 1.0) if policy == "mixed_float16" else set(scales) == {1.0}


def test_recompute_blocks_and_unknown_block(tmp_path):
    from tfship.pipeline.training.model import _recompute_class

    plain = _train(tmp_path / "plain", {"train.deterministic": True})
    result = _train(tmp_path, {"model.recompute": ["conv1", "hidden"], "train.deterministic": True})
    assert result.train_step_traces == 1 and result.summary()["recompute"] == ["conv1", "hidden"]
    assert not any(isinstance(layer, _recompute_class()) for layer in result.model.layers)  # export gets a plain model
    for a, b in zip(plain.model.get_weights(), result.model.get_weights()):  # same math, activations recomputed
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match=r"model.recompute: no layer named \['conv9'\]"):
        _train(tmp_path / "b", {"model.recompute": ["conv9"]})


def test_user_factory_and_xla_auto_choice(tmp_path):
    result = _train(tmp_path, {"model.factory": "tests.pipeline.test_train_options:small_factory",
                               "model.factory_args": {"width": 8}, "train.jit_compile": "auto"})
    assert result.model.get_layer("user_dense").units == 8
    xla = result.summary()["xla"]
    assert set(xla["steps_per_second"]) == {"xla", "no_xla"} and "faster" in xla["reason"]
    assert result.jit_compile == (xla["steps_per_second"]["xla"] >= xla["steps_per_second"]["no_xla"])
    assert result.train_step_traces == 1


def test_xla_failure_names_the_op_and_training_continues(tmp_path):
    lines = []
    result = _train(tmp_path, {"model.factory": "tests.pipeline.test_train_options:not_xla_factory",
                               "train.jit_compile": True}, log=lines.append)
    assert result.jit_compile is False and result.train_step_traces == 1
    failed = [line for line in lines if "XLA cannot compile" in line]
    assert len(failed) == 1 and "PyFunc" in failed[0]


def test_non_finite_loss_names_step_and_variable(tmp_path):
    with pytest.raises(StageError, match=r"step 1: loss nan; first non-finite gradient: first/kernel"):
        _train(tmp_path, {"model.factory": "tests.pipeline.test_train_options:exploding_factory"})


def test_determinism_gives_identical_weights_and_restores_process_state(tmp_path):
    import tensorflow as tf

    overrides = {"train.deterministic": True, "train.epochs": 2}
    first = _train(tmp_path / "a", overrides).model.get_weights()
    second = _train(tmp_path / "b", overrides).model.get_weights()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    from tensorflow.python.framework import config as tf_config

    assert not tf_config.is_op_determinism_enabled() and not tf.config.functions_run_eagerly()


def test_run_eagerly_debug_switch_is_scoped(tmp_path):
    import tensorflow as tf

    result = _train(tmp_path, {"train.run_eagerly": True})
    assert "run_eagerly" in result.summary()["xla"]["reason"] and not tf.config.functions_run_eagerly()


def test_early_stopping_on_validation_metric(tmp_path):
    result = _train(tmp_path, {"train.epochs": 10, "train.early_stopping_patience": 1,
                               "train.early_stopping_min_delta": 1.0})
    assert result.summary()["stopped_early"] and len(result.history) == 2


def test_resume_in_process_equals_uninterrupted_run(tmp_path):
    overrides = {"train.deterministic": True, "train.epochs": 2, "train.checkpoint_every_steps": 5}
    full = _train(tmp_path / "full", overrides)
    config_one = {**overrides, "train.epochs": 1}
    _train(tmp_path / "part", config_one)
    resumed = _train(tmp_path / "part", overrides, resume=True)
    assert resumed.summary()["resumed_from_step"] == 18 and resumed.steps == full.steps
    for a, b in zip(full.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert [h.epoch for h in resumed.history] == [1, 2]
    with pytest.raises(StageError, match="no checkpoint"):
        _train(tmp_path / "empty", overrides, resume=True)


def _scalars(folder, tag):
    import tensorflow as tf

    values = []
    for file in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(file)):
            for value in event.summary.value:
                if value.tag == tag:
                    values.append(float(tf.make_ndarray(value.tensor)))
    return values


def test_tensorboard_scalars_and_histograms(tmp_path):
    import tensorflow as tf

    _train(tmp_path, {"train.tensorboard": True, "train.log_every_steps": 2, "train.histogram_every_steps": 6,
                      "train.steps_per_execution": 1}, tensorboard_dir=tmp_path / "tb")
    tags, plugins = set(), {}
    for file in (tmp_path / "tb" / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(file)):
            for value in event.summary.value:
                tags.add(value.tag)
                plugins[value.tag] = value.metadata.plugin_data.plugin_name or plugins.get(value.tag)
    assert {"loss", "accuracy", "learning_rate", "gradient_global_norm", "loss_scale"} <= tags
    assert plugins["loss"] == "scalars" and plugins["conv0/kernel"] == "histograms"
    assert len(_scalars(tmp_path / "tb" / "train", "loss")) == 18 // 2
    assert _scalars(tmp_path / "tb" / "validation", "accuracy")


def _scalar_steps(folder, tag):
    import tensorflow as tf

    return [event.step for file in sorted(folder.glob("events.out.tfevents.*"))
            for event in tf.compat.v1.train.summary_iterator(str(file))
            for value in event.summary.value if value.tag == tag]


def test_tensorboard_at_k_steps_per_trip_logs_each_crossed_period_once_at_the_block_end(tmp_path):
    # One epoch of 18 steps, K = 4: blocks end at 4, 8, 12, 16 and 18 (the epoch's end); each crosses a scalar
    # period of 2 (logged once, at the block's end), and the histogram periods 6, 12, 18 fall in the blocks
    # ending at 8, 12 and 18.
    result = _train(tmp_path, {"train.tensorboard": True, "train.log_every_steps": 2,
                               "train.histogram_every_steps": 6, "train.steps_per_execution": 4},
                    tensorboard_dir=tmp_path / "tb")
    assert result.steps == 18 and result.summary()["steps_per_execution"]["blocks"] == 5
    assert _scalar_steps(tmp_path / "tb" / "train", "loss") == [4, 8, 12, 16, 18]
    assert _scalar_steps(tmp_path / "tb" / "train", "conv0/kernel") == [8, 12, 18]
