"""Export of arbitrary Keras models from their declared contract, and the audit + behaviour checks on
models built on purpose to leak training behaviour: each case ends in a correct artifact or a refusal
naming the cause (the Keras layer, the check, the dtype)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import AuditError, ContractError
from tfship.core.saved_model import read_signatures
from tfship.pipeline.gate.behaviour import check_behaviour
from tfship.pipeline.gate.behaviour import raise_if_failed as raise_if_behaviour_failed
from tfship.signatures.audit import audit_saved_model, raise_if_failed
from tfship.signatures.export import export_saved_model
from tfship.signatures.keras_export import build_keras_module, contract_from_keras, extra_contract, float32_copy
from tfship.signatures.layers import keras_layers

RNG = np.random.default_rng(0)


def _export(model, folder, extra=None):
    model = float32_copy(model)
    contract = contract_from_keras(model)
    extras = tuple(extra_contract(contract, k, v) for k, v in (extra or {}).items())
    export_saved_model(build_keras_module(model, contract, extra), contract, folder, extras)
    return model, contract


def _audit(model, folder):
    return audit_saved_model(folder, [w.path for w in model.weights], keras_layers(model))


def _call(folder, feed, signature="serving_default"):
    function = tf.saved_model.load(str(folder)).signatures[signature]
    return {k: v.numpy() for k, v in function(**{k: tf.constant(v) for k, v in feed.items()}).items()}


def test_twelve_reordered_dict_heads_keep_their_names_and_values(tmp_path):
    inputs = keras.Input((5,), name="features")
    hidden = keras.layers.Dense(16, activation="relu", name="trunk")(inputs)
    names = [f"head_{i:02d}" for i in (11, 3, 7, 0, 9, 1, 10, 5, 2, 8, 4, 6)]  # deliberately not sorted
    heads = {name: keras.layers.Dense(i % 3 + 1, name=name)(hidden) for i, name in enumerate(names)}
    model = keras.Model(inputs, heads)
    model, contract = _export(model, tmp_path / "m", {"first_two": tuple(names[:2])})
    assert contract.output_names() == tuple(names)
    written = read_signatures(tmp_path / "m")
    assert set(written) == {"serving_default", "first_two"}
    assert {t.name for t in written["first_two"].outputs.values()} == set(names[:2])
    x = RNG.standard_normal((7, 5)).astype("float32")
    got, want = _call(tmp_path / "m", {"features": x}), model(x, training=False)
    for name in names:  # by name: a reordering would swap heads of different widths/values
        np.testing.assert_allclose(got[name], keras.ops.convert_to_numpy(want[name]), atol=1e-5)
    raise_if_failed(_audit(model, tmp_path / "m"))
    raise_if_behaviour_failed(check_behaviour(tmp_path / "m", {"features": x}))


class ForcedTrainingBatchNorm(keras.layers.BatchNormalization):
    def call(self, inputs, training=None):
        return super().call(inputs, training=True)


def test_batch_norm_forced_into_training_is_refused_naming_the_layer(tmp_path):
    inputs = keras.Input((4,), name="x")
    hidden = ForcedTrainingBatchNorm(name="leaky_bn")(keras.layers.Dense(8, name="dense")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="y")(hidden))
    _export(model, tmp_path / "bn")
    with pytest.raises(AuditError, match=r"'leaky_bn' \(ForcedTrainingBatchNorm, a BatchNormalization\) runs in "
                                         r"training mode"):
        raise_if_failed(_audit(model, tmp_path / "bn"))
    report = check_behaviour(tmp_path / "bn", {"x": RNG.standard_normal((8, 4)).astype("float32")})
    failed = {c.name for c in report.checks if not c.passed}
    assert failed == {"batch_independent", "stateless"}
    with pytest.raises(AuditError, match="leaky_bn/moving_mean"):
        raise_if_behaviour_failed(report)


def test_plain_batch_norm_and_augmentation_in_inference_mode_pass(tmp_path):
    inputs = keras.Input((6, 6, 1), name="image")
    hidden = keras.layers.RandomFlip(name="flip")(inputs)
    hidden = keras.layers.BatchNormalization(name="bn")(keras.layers.Conv2D(2, 3, name="conv")(hidden))
    hidden = keras.layers.Dropout(0.5, name="drop")(keras.layers.Flatten(name="flat")(hidden))
    model = keras.Model(inputs, keras.layers.Dense(3, name="scores")(hidden))
    _export(model, tmp_path / "ok")
    raise_if_failed(_audit(model, tmp_path / "ok"))
    raise_if_behaviour_failed(check_behaviour(tmp_path / "ok", {"image": RNG.random((9, 6, 6, 1), "float32")}))


class AlwaysFlip(keras.layers.RandomFlip):
    def call(self, inputs, training=None):
        return super().call(inputs, training=True)


class AlwaysDropout(keras.layers.Dropout):
    def call(self, inputs, training=None):
        return super().call(inputs, training=True)


@pytest.mark.parametrize("layer, cause", [
    (lambda: AlwaysFlip(name="aug"), r"augmentation layer 'aug' \(AlwaysFlip, a RandomFlip\)"),
    (lambda: AlwaysDropout(0.5, name="drop"), r"'drop' \(AlwaysDropout, a Dropout\) is active at serving time"),
])
def test_random_layers_active_at_serving_are_refused_naming_the_layer(tmp_path, layer, cause):
    inputs = keras.Input((4, 4, 1), name="image")
    hidden = keras.layers.Flatten(name="flat")(layer()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="y")(hidden))
    _export(model, tmp_path / "rnd")
    report = _audit(model, tmp_path / "rnd")
    assert any("random op" in v for v in report.violations)
    with pytest.raises(AuditError, match=cause):
        raise_if_failed(report)
    behaviour = check_behaviour(tmp_path / "rnd", {"image": RNG.random((8, 4, 4, 1), "float32")})
    assert not next(c for c in behaviour.checks if c.name == "deterministic").passed


def test_mixed_precision_model_exports_a_float32_contract(tmp_path):
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input((3,), name="x")
        model = keras.Model(inputs, keras.layers.Dense(2, name="y")(keras.layers.Dense(4, name="h")(inputs)))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert model.outputs[0].dtype == "float16"
    copy, contract = _export(model, tmp_path / "mp")
    written = read_signatures(tmp_path / "mp")["serving_default"]
    assert [t.dtype for t in (*written.inputs.values(), *written.outputs.values())] == ["float32", "float32"]
    x = RNG.standard_normal((5, 3)).astype("float32")
    got = _call(tmp_path / "mp", {"x": x})["y"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(x)).astype("float32"), atol=2e-2)


def test_string_lookup_input_round_trips(tmp_path):
    words = keras.Input((1,), name="word", dtype="string")
    amount = keras.Input((2,), name="amount", dtype="float32")
    ids = keras.layers.StringLookup(vocabulary=["red", "green", "blue"], output_mode="one_hot", name="lookup")(words)
    joined = keras.layers.Concatenate(name="join")([keras.layers.Flatten(name="flat")(ids), amount])
    model = keras.Model({"word": words, "amount": amount}, keras.layers.Dense(1, name="price")(joined))
    _, contract = _export(model, tmp_path / "str")
    assert {t.name: t.dtype for t in contract.inputs.values()} == {"word": "string", "amount": "float32"}
    feed = {"word": np.array([["red"], ["blue"], ["mauve"]]), "amount": RNG.random((3, 2), "float32")}
    np.testing.assert_allclose(_call(tmp_path / "str", feed)["price"], keras.ops.convert_to_numpy(model(feed)),
                               atol=1e-5)
    raise_if_failed(_audit(model, tmp_path / "str"))


def test_written_signature_that_differs_from_the_contract_is_refused(tmp_path):
    inputs = keras.Input((3,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(2, name="y")(inputs))
    wrong = Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, 3)),),
                              (TensorSpec(name="y", dtype="int64", shape=(None, 2)),))
    with pytest.raises(ContractError, match="output 'y' dtype float32, expected int64"):
        export_saved_model(build_keras_module(model, wrong), wrong, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
