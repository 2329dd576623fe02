"""A `.tflite` file is judged before LiteRT builds an interpreter on it (`serving.runtimes.tflite_check`): a cut or
foreign file is refused with a clear reason, and custom ops (Flex's TensorFlow ops among them) are refused unless
`--allow-ops` names them; a builtin-only file serves."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.serving.runtimes.base import RuntimeLoadError, RuntimeOptions
from tfship.serving.runtimes.tflite import TfliteRuntime


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{"builtin": version folder of `y = x @ ones + 1`, "flex": one whose op needs Flex (a string regex)}."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("tflite_check")

    class Dense(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, tf.ones((4, 2))) + 1.0}

    class Regex(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
        def serve(self, s):
            return {"y": tf.strings.regex_replace(s, "a", "b")}

    folders = {}
    for name, module, ops in (("builtin", Dense(), [tf.lite.OpsSet.TFLITE_BUILTINS]),
                              ("flex", Regex(), [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS])):
        converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
        converter.target_spec.supported_ops = ops
        folders[name] = root / name / "1"
        folders[name].mkdir(parents=True)
        (folders[name] / "model.tflite").write_bytes(converter.convert())
    return folders


def test_a_builtin_file_serves(files):
    runtime = TfliteRuntime(files["builtin"])
    runtime.load()
    np.testing.assert_allclose(runtime.predict({"x": np.ones((1, 4), np.float32)})["y"], [[5.0, 5.0]])


@pytest.mark.parametrize(("cut", "why"), [(0.5, r"not a valid TFLite flatbuffer \(\d+ bytes\): error: unpack_from"),
                                          (0.002, r"not a TFLite flatbuffer \(\d+ bytes, no TFL3 identifier\)")])
def test_a_cut_file_is_refused_with_a_clear_reason(files, tmp_path, cut, why):
    data = (files["builtin"] / "model.tflite").read_bytes()
    (tmp_path / "model.tflite").write_bytes(data[:max(int(len(data) * cut), 2)])
    with pytest.raises(RuntimeLoadError, match=rf"refused .*model\.tflite: {why}"):
        TfliteRuntime(tmp_path).load()


def test_custom_and_flex_ops_are_refused_unless_allowed(files):
    with pytest.raises(RuntimeLoadError, match=r"custom op 'FlexStaticRegexReplace' \(a TensorFlow op: LiteRT runs it "
                                               r"only with the Flex delegate.*--allow-ops"):
        TfliteRuntime(files["flex"]).load()
    allowed = TfliteRuntime(files["flex"], RuntimeOptions(allow_ops=("FlexStaticRegexReplace",)))
    allowed.load()  # past the check: what the op then does is LiteRT's (the bundled one has no Flex delegate)
    assert allowed.ready
