"""A left-out artifact's headline is the blocker the conversion itself reports; tfship's diagnosis ("fix that
axis's length to unroll it") is added only when it holds. A masked `Embedding(mask_zero=True) -> GRU` has a
fixed time axis (its `layer.input` is `[sequence, mask]`): it is unrolled, and what stops it is the
TextVectorization's string ops, not its loop; a string-op model with no recurrence is told the same ops."""

from __future__ import annotations

import pytest

from tfship.pipeline.orchestration.reasons import FIRST_LINE_LIMIT, first_line
from tfship.signatures.recurrent import recurrent_layers, unrolled_copy

STRING_OPS = ('<unknown>:0: error: loc(fused["StringLower:", "functional/text_vectorization/StringLower@__inference_'
              "serve_41\"]): 'tf.StringLower' op is neither a custom op nor a flex op <unknown>:0: error: failed "
              "while converting: 'main'")
TENSOR_LIST = ("converter failed: ConverterError: <unknown>:0: error: Lowering tensor list ops is failed. Please "
               "consider using Select TF ops and disabling `_experimental_lower_tensor_list_ops` flag")
FUSED = ("TFLite's fused-LSTM path needs TF2 Keras' experimental_implements LSTM annotation, which Keras 3 layers "
         "do not carry")
# tflite.formats' record for a masked GRU behind a TextVectorization: the default recipe fails on the loop, the
# unrolled copy on the string ops.
MASKED_GRU = (f"refused: recipe 'default' (dynamic batch): {TENSOR_LIST}; recipe 'unrolled' (recurrent layers "
              f"with unroll=True): converter failed: ConverterError: {STRING_OPS}; {FUSED}")


def _masked_gru():
    import keras

    tokens = keras.Input((16,), dtype="int64", name="tokens")
    embedded = keras.layers.Embedding(50, 4, mask_zero=True, name="embedding")(tokens)
    return keras.Model(tokens, keras.layers.Dense(2)(keras.layers.GRU(3, name="gru")(embedded)))


def test_masked_recurrent_layer_has_its_fixed_time_axis_and_unrolls():
    model = _masked_gru()
    assert recurrent_layers(model) == {"gru": 16}
    clone = unrolled_copy(model)
    assert clone is not None and clone.get_layer("gru").unroll


def test_headline_of_an_unrolled_recurrent_model_is_the_string_ops_blocker():
    line = first_line(MASKED_GRU)
    assert "ops tf.StringLower are neither TFLite builtins nor Flex ops" in line, line
    assert "at node 'functional/text_vectorization/StringLower'" in line, line
    assert "fix that axis" not in line and "variable-length" not in line and len(line) <= FIRST_LINE_LIMIT


def test_headline_of_a_string_op_model_without_recurrence_names_the_ops():
    line = first_line(f"refused: converter failed: ConverterError: {STRING_OPS}")
    assert line.startswith("refused: converter failed: ConverterError: ops tf.StringLower are neither"), line


def test_unrolled_copy_s_own_error_is_the_headline():
    reason = (f"refused: recipe 'default' (dynamic batch): {TENSOR_LIST}; recipe 'unrolled' (recurrent layers with "
              "unroll=True): converter failed: ConverterError: <unknown>:0: error: 'tfl.gather' op operand #0 "
              f"must be tensor of any type values; {FUSED}")
    line = first_line(reason)
    assert "with the recurrent layers unrolled, the converter still fails: 'tfl.gather' op operand #0" in line, line
    assert "fix that axis" not in line


def test_unrolled_copy_needing_flex_ops_is_the_headline():
    reason = (f"refused: recipe 'default' (dynamic batch): {TENSOR_LIST}; recipe 'unrolled' (recurrent layers with "
              "unroll=True): needs Flex (select TF) ops ['StringLower', 'StringSplitV2'], which the bundled LiteRT "
              "(ai_edge_litert) cannot run: it has no Flex delegate. Express the layer with TFLite builtin ops; "
              f"{FUSED}")
    line = first_line(reason)
    assert ("with the recurrent layers unrolled, the converter still fails: needs Flex (select TF) ops "
            "['StringLower', 'StringSplitV2']") in line, line
    assert "fix that axis" not in line and "TensorList" not in line


def test_dynamic_time_axis_keeps_the_unroll_advice():
    reason = (f"refused: recipe 'default' (dynamic batch): {TENSOR_LIST}; recipe 'unrolled' not available: no "
              "unrolled copy: ValueError: recurrent layer(s) ['gru'] have a dynamic time dimension; unrolling needs "
              f"fixed steps; {FUSED}")
    assert "recurrent layer(s) ['gru'] over a variable-length axis" in first_line(reason)
    assert "fix that axis's length to unroll it" in first_line(reason)


def _tflite_reason(tmp_path, model, texts):
    """The tflite_float32 reason of a real export + conversion of `model` on `texts`."""
    import numpy as np

    from tfship.core.errors import TfshipError
    from tfship.pipeline.config import load_config
    from tfship.pipeline.export_only.user_model import load_user_data
    from tfship.pipeline.orchestration import steps
    from tfship.pipeline.orchestration.stages import RunFolder

    config = load_config(None, {"convert.tflite_modes": ["float32"], "export.behaviour_checks": False,
                                "convert.onnx": False})
    run = RunFolder.create(tmp_path / "runs", "blocker")
    np.savez(tmp_path / "data.npz", text=texts, y=np.array([1, 0, 1, 0] * 4))
    steps.export_user_stage(config, run, model, tmp_path / "data.npz")
    data = load_user_data(tmp_path / "data.npz", steps.read_contract(run), 8, 0)
    try:
        return {o.name: o.reason for o in steps.convert_stage(config, run, data).outcomes}["tflite_float32"]
    except TfshipError as err:
        return str(err)


def _text_model(recurrent: bool):
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    texts = np.array([["good film"], ["bad film"], ["fine story"], ["dull plot"]] * 4)
    vectorize = keras.layers.TextVectorization(50, output_sequence_length=16, name="vectorize")
    vectorize.adapt(texts[:, 0])
    text = keras.Input((1,), dtype="string", name="text")
    embedded = keras.layers.Embedding(50, 4, mask_zero=recurrent, name="embedding")(vectorize(text))
    pooled = keras.layers.GRU(3, name="gru")(embedded) if recurrent else \
        keras.layers.GlobalAveragePooling1D(name="pool")(embedded)
    return keras.Model(text, keras.layers.Dense(2, name="scores")(pooled)), texts


@pytest.mark.slow
def test_masked_gru_behind_text_vectorization_is_told_its_string_ops(tmp_path):
    """The real conversion: the masked GRU unrolls (time axis 16), and the headline names the string ops."""
    model, texts = _text_model(recurrent=True)
    assert recurrent_layers(model) == {"gru": 16}
    reason = _tflite_reason(tmp_path, model, texts)
    line = first_line(reason)
    assert "fix that axis" not in line and "variable-length" not in line, (line, reason)
    assert "with the recurrent layers unrolled" in line and "StringLower" in line, (line, reason)


@pytest.mark.slow
def test_text_model_without_recurrence_is_told_its_string_ops(tmp_path):
    model, texts = _text_model(recurrent=False)
    reason = _tflite_reason(tmp_path, model, texts)
    line = first_line(reason)
    assert "StringLower" in line and "Flex" in line and "TensorList" not in line, (line, reason)
