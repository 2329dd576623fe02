"""Exports are forward-only and XLA-free, whatever the model's layers trace.

Custom-gradient backward functions (Keras' swish / silu, `tf.custom_gradient`) left in the function library
are removed and never judged by the audit; must-compile marks of inner `tf.function(jit_compile=True)`s
(Keras' grouped convolution, a layer's own jit-compiled call) are removed so servers without the XLA JIT
run the SavedModel; a real violation in a re-exported SavedModel names the name scope (the layer) it sits in.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfship.core import protocol
from tfship.core.saved_model import read_signatures
from tfship.pipeline.conversion.artifacts import saved_model_runner
from tfship.signatures.audit import audit_saved_model
from tfship.signatures.export import build_savedmodel_module, export_saved_model
from tfship.signatures.forward_only import MUST_COMPILE
from tfship.signatures.keras_export import build_keras_module, contract_from_keras

FEATURES = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
IMAGES = np.random.default_rng(4).standard_normal((3, 6, 6, 4)).astype(np.float32)


def _library(folder) -> dict:
    saved_model = protocol.SavedModel.FromString((folder / "saved_model.pb").read_bytes())
    return {f.signature.name: f for f in saved_model.meta_graphs[0].graph_def.library.function}


def _marked(folder) -> list[str]:
    """Functions of `folder`'s SavedModel marked must-compile, or kept a call of their own (`_noinline`)."""
    return [name for name, f in _library(folder).items()
            if (MUST_COMPILE in f.attr and f.attr[MUST_COMPILE].b) or ("_noinline" in f.attr and f.attr["_noinline"].b)]


def _reexport(source, folder):
    contracts = read_signatures(source)
    contract = contracts["serving_default"]
    extras = tuple(c for name, c in contracts.items() if name != contract.name)
    result = export_saved_model(build_savedmodel_module(source, contract, extra_contracts=extras), contract, folder,
                                extras)
    return result, audit_saved_model(folder)


def _dense_swish():
    inputs = keras.Input((4,), name="x")
    return keras.Model(inputs, keras.layers.Dense(3, activation="swish", name="dense_swish")(inputs))


def test_keras_export_of_a_swish_model_is_re_exported_without_its_gradient_functions(tmp_path):
    model = _dense_swish()
    model.export(str(tmp_path / "source"), verbose=False)
    result, audit = _reexport(tmp_path / "source", tmp_path / "out")
    assert audit.passed, audit.violations
    assert not [name for name in _library(tmp_path / "out") if "grad" in name]
    assert any("internal_grad_fn" in name for name in result.cleanup.removed_functions), result.cleanup
    np.testing.assert_allclose(saved_model_runner(tmp_path / "out")({"x": FEATURES})["output_0"],
                               model.predict(FEATURES, verbose=0), rtol=1e-6, atol=1e-6)


class _CustomGradient(tf.Module):
    """A `tf.custom_gradient` op (clipped identity on the way back) in a module saved with custom gradients."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.eye(4, 2, dtype=np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def __call__(self, x):
        @tf.custom_gradient
        def soft(value):
            return tf.nn.softplus(value), lambda upstream: tf.clip_by_value(upstream, -1.0, 1.0)

        return {"y": soft(tf.matmul(x, self.w))}


def test_a_custom_gradient_module_saved_with_its_gradients_publishes_forward_only(tmp_path):
    module = _CustomGradient()
    tf.saved_model.save(module, str(tmp_path / "source"), signatures={"serving_default": module.__call__})
    _, audit = _reexport(tmp_path / "source", tmp_path / "out")
    assert audit.passed, audit.violations
    saved = protocol.SavedModel.FromString((tmp_path / "out" / "saved_model.pb").read_bytes())
    assert not saved.meta_graphs[0].graph_def.library.registered_gradients
    np.testing.assert_allclose(saved_model_runner(tmp_path / "out")({"x": FEATURES})["y"],
                               tf.nn.softplus(FEATURES @ module.w.numpy()).numpy(), rtol=1e-6)


class _Noisy(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def __call__(self, x):
        with tf.name_scope("noisy_layer"):
            return {"y": tf.nn.dropout(x, 0.5)}


def test_a_real_violation_in_a_re_exported_saved_model_names_its_scope(tmp_path):
    module = _Noisy()
    tf.saved_model.save(module, str(tmp_path / "source"), signatures={"serving_default": module.__call__})
    _, audit = _reexport(tmp_path / "source", tmp_path / "out")
    assert any("random op" in v and "in name scope 'noisy_layer" in v for v in audit.violations), audit.violations


@keras.saving.register_keras_serializable(package="tests_forward_only")
class JitDouble(keras.layers.Layer):
    """A layer whose call is a `tf.function(jit_compile=True)`: y = 2 x."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._double = tf.function(lambda x: x * 2.0, jit_compile=True)

    def call(self, x):
        return self._double(x)


def _jit_layer():
    inputs = keras.Input((4,), name="x")
    return keras.Model(inputs, JitDouble(name="jit_double")(inputs))


def _grouped_conv():
    inputs = keras.Input((6, 6, 4), name="image")
    features = keras.layers.Conv2D(4, 3, padding="same", groups=4, name="grouped")(inputs)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D(name="pool")(features))


@pytest.mark.parametrize("build, feed", [
    (_jit_layer, FEATURES),
    (_grouped_conv, IMAGES),
], ids=["jit_compiled_layer", "grouped_conv"])
def test_exports_carry_no_must_compile_function(tmp_path, build, feed):
    model = build()
    contract = contract_from_keras(model)
    result = export_saved_model(build_keras_module(model, contract), contract, tmp_path / "keras")
    assert not _marked(tmp_path / "keras") and result.cleanup.xla_unmarked, result.cleanup
    assert audit_saved_model(tmp_path / "keras").passed
    expected = model.predict(feed, verbose=0)
    (name,) = contract.input_names()
    (output,) = contract.output_names()
    np.testing.assert_allclose(saved_model_runner(tmp_path / "keras")({name: feed})[output], expected, atol=1e-5)

    model.export(str(tmp_path / "source"), verbose=False)
    assert _marked(tmp_path / "source")
    raw = audit_saved_model(tmp_path / "source")
    assert any("must-compile" in v and "XLA" in v for v in raw.violations), raw.violations
    _, audit = _reexport(tmp_path / "source", tmp_path / "out")
    assert audit.passed and not _marked(tmp_path / "out"), audit.violations
    got = saved_model_runner(tmp_path / "out")({name: feed})["output_0"]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_the_audit_names_the_layer_of_a_must_compile_call(tmp_path):
    _grouped_conv().export(str(tmp_path / "source"), verbose=False)
    audit = audit_saved_model(tmp_path / "source")
    assert any("must-compile function" in v and "in name scope" in v and "grouped" in v for v in audit.violations)


def test_a_grouped_conv_keras_export_converts_to_onnx_once_re_exported(tmp_path):
    """tf2onnx does not inline a must-compile function: `No Op registered for StatefulPartitionedCall`."""
    from tfship.onnx_format.convert import convert_to_onnx
    from tfship.pipeline.conversion.artifacts import Artifact, open_runner

    model = _grouped_conv()
    model.export(str(tmp_path / "source"), verbose=False)
    _reexport(tmp_path / "source", tmp_path / "out")
    contract = read_signatures(tmp_path / "out")["serving_default"]
    convert_to_onnx(tmp_path / "out", tmp_path / "out" / "model.onnx", contract, 17, {"image": IMAGES}, 300)
    runner = open_runner(Artifact("onnx", "onnx", "float32", tmp_path / "out" / "model.onnx"))
    np.testing.assert_allclose(runner({"image": IMAGES})["output_0"], model.predict(IMAGES, verbose=0), atol=1e-5)


@pytest.mark.parametrize("build, feed", [
    (_jit_layer, FEATURES),
    (_grouped_conv, IMAGES),
], ids=["jit_compiled_layer", "grouped_conv"])
def test_a_must_compile_function_converts_to_tflite_once_unmarked(tmp_path, build, feed):
    """The TFLite converter cannot lower a `_noinline` call (`StatefulPartitionedCallOp` left in the final IR;
    ConvNeXt's grouped convolutions): the re-exported SavedModel converts and LiteRT answers as Keras does."""
    from tfship.serving.runtimes.litert import LiteRtModel
    from tfship.tflite.convert import convert_tflite
    from tfship.tflite.modes import TfliteMode, TfliteOptions

    model = build()
    model.export(str(tmp_path / "source"), verbose=False)
    _reexport(tmp_path / "source", tmp_path / "out")
    result = convert_tflite(tmp_path / "out", tmp_path / "model.tflite", TfliteOptions(TfliteMode.FLOAT32), None, 300)
    assert result.status == "produced", result.reason
    (name,) = read_signatures(tmp_path / "out")["serving_default"].input_names()
    np.testing.assert_allclose(LiteRtModel(result.path).run({name: feed})["output_0"], model.predict(feed, verbose=0),
                               atol=1e-5)
