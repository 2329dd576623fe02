"""Each TFLite variant of the digits CNN is produced, runs at batch 1, 3 and 16 and matches the SavedModel."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from tfship.serving.runtimes.litert import LiteRtModel
from tfship.tflite.convert import convert_tflite
from tfship.tflite.inspect import describe_tflite
from tfship.tflite.modes import TfliteMode, TfliteOptions

BATCH_SIZES = (1, 3, 16)
OUTPUTS = ("class_id", "logits", "probabilities")


def _produced(result):
    assert result.status == "produced", result.reason
    assert result.path is not None and result.path.is_file()
    assert result.size_bytes == result.path.stat().st_size > 0
    assert result.flex_ops == ()
    return result


@pytest.mark.parametrize("key", ["float32", "float16", "dynamic_range", "int8", "int8_io"])
def test_variant_keeps_names_dtypes_and_dynamic_batch(digits_variant, key):
    result = _produced(digits_variant(key))
    contract = LiteRtModel(result.path).contract()
    assert contract.input_names == ("image",)
    assert contract.output_names == OUTPUTS
    assert contract.inputs[0].shape_signature == (-1, 8, 8, 1)
    shapes = {t.name: t.shape_signature for t in contract.outputs}
    assert shapes == {"class_id": (-1,), "logits": (-1, 10), "probabilities": (-1, 10)}
    dtypes = {t.name: t.dtype for t in contract.outputs}
    float_out = np.int8 if key == "int8_io" else np.float32
    assert dtypes == {"class_id": np.int64, "logits": float_out, "probabilities": float_out}
    assert contract.inputs[0].dtype == (np.int8 if key == "int8_io" else np.float32)


@pytest.mark.parametrize(("key", "rtol", "atol"), [("float32", 1e-5, 1e-5), ("float16", 1e-2, 1e-2)])
def test_float_variants_match_savedmodel_at_every_batch(digits_variant, digits_saved_model, digits_data,
                                                        reference, key, rtol, atol):
    runner = LiteRtModel(_produced(digits_variant(key)).path)
    for batch in BATCH_SIZES:
        images = digits_data["test_x"][:batch]
        want, got = reference(digits_saved_model, {"image": images}), runner.run({"image": images})
        assert sorted(got) == sorted(want) == list(OUTPUTS)
        for name in ("logits", "probabilities"):
            assert got[name].shape == want[name].shape == (batch, 10)
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=f"{key} {name}")
        assert got["class_id"].dtype == np.int64
        assert np.mean(got["class_id"] == want["class_id"]) >= (1.0 if key == "float32" else 0.9)


@pytest.mark.parametrize("key", ["dynamic_range", "int8", "int8_io"])
def test_quantized_variants_agree_on_top1(digits_variant, digits_saved_model, digits_data, reference, key):
    runner = LiteRtModel(_produced(digits_variant(key)).path)
    for batch in BATCH_SIZES:
        got = runner.run({"image": digits_data["test_x"][:batch]})
        assert got["logits"].shape == got["probabilities"].shape == (batch, 10)
        assert got["logits"].dtype == got["probabilities"].dtype == np.float32
        assert got["class_id"].shape == (batch,) and got["class_id"].dtype == np.int64
    images = digits_data["test_x"][:400]
    want, got = reference(digits_saved_model, {"image": images}), runner.run({"image": images})
    assert np.mean(got["class_id"] == want["class_id"]) >= 0.95
    assert np.mean(np.argmax(got["logits"], axis=1) == want["class_id"]) >= 0.95
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=0.15)
    assert np.mean(got["class_id"] == digits_data["test_y"][:400]) >= 0.85  # the model still works


def test_int8_outputs_are_dequantized_with_their_own_scale(digits_variant, digits_data):
    path = _produced(digits_variant("int8_io")).path
    images = digits_data["test_x"][:5]
    runner = LiteRtModel(path)
    specs = {t.name: t for t in runner.contract().outputs}
    image_spec = runner.contract().inputs[0]
    assert image_spec.quantized and specs["logits"].quantized and specs["probabilities"].quantized
    assert specs["logits"].scale != specs["probabilities"].scale
    raw = Interpreter(model_path=str(path)).get_signature_runner("serving_default")(
        image=np.clip(np.round(images / image_spec.scale) + image_spec.zero_point, -128, 127).astype(np.int8))
    got = runner.run({"image": images})
    for name in ("logits", "probabilities"):
        assert raw[name].dtype == np.int8
        want = (raw[name].astype(np.float32) - specs[name].zero_point) * specs[name].scale
        np.testing.assert_array_equal(got[name], want)
    np.testing.assert_array_equal(got["class_id"], raw["class_id"])


def test_sizes_shrink_with_quantization(digits_variant):
    sizes = {key: _produced(digits_variant(key)).size_bytes
             for key in ("float32", "float16", "dynamic_range", "int8", "int8_io")}
    print(f"digits CNN .tflite sizes (bytes): {sizes}")
    assert sizes["int8"] < 0.45 * sizes["float32"], sizes
    assert sizes["dynamic_range"] < 0.45 * sizes["float32"], sizes
    assert sizes["float16"] < 0.65 * sizes["float32"], sizes


def test_describe_reports_quantization_and_ops(digits_variant):
    summary = describe_tflite(_produced(digits_variant("int8_io")).path)
    io = summary["signatures"]["serving_default"]
    assert io["inputs"]["image"]["dtype"] == "int8"
    assert io["inputs"]["image"]["shape_signature"] == [-1, 8, 8, 1]
    assert len(io["inputs"]["image"]["quantization"]["scales"]) == 1
    assert io["outputs"]["class_id"] == {"dtype": "int64", "shape_signature": [-1], "quantization": None}
    assert summary["op_histogram"]["CONV_2D"] == 1 and summary["op_histogram"]["FULLY_CONNECTED"] == 2
    assert summary["flex_ops"] == [] and summary["custom_ops"] == []
    assert summary["size_bytes"] == digits_variant("int8_io").size_bytes
    float_ops = describe_tflite(digits_variant("float32").path)["op_histogram"]
    assert "QUANTIZE" not in float_ops and "DEQUANTIZE" not in float_ops


def test_multi_io_outputs_matched_by_name(tmp_path, multi_io_saved_model, reference):
    rng = np.random.default_rng(1)
    result = _produced(convert_tflite(multi_io_saved_model, tmp_path / "multi.tflite",
                                      TfliteOptions(TfliteMode.FLOAT32), None, 240.0))
    runner = LiteRtModel(result.path)
    assert runner.contract().input_names == ("narrow", "wide")
    assert runner.contract().output_names == ("alpha", "middle", "zeta")
    for batch in BATCH_SIZES:
        inputs = {"wide": rng.standard_normal((batch, 6)).astype(np.float32),
                  "narrow": rng.standard_normal((batch, 2)).astype(np.float32)}
        want, got = reference(multi_io_saved_model, inputs), runner.run(inputs)
        assert {k: v.shape for k, v in got.items()} == {
            "alpha": (batch, 2), "middle": (batch, 5), "zeta": (batch, 3)}
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert not result.path.with_name("multi.tflite.representative.npz").exists()
    script = result.path.with_name("multi.tflite.reproduce.sh")
    assert result.reproduce_command in script.read_text()
    result.path.unlink()
    temp = tmp_path / "temp"  # the script's TMPDIR: its reports folder goes when it ends
    temp.mkdir()
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count('"status": "produced"') == 2, done.stdout[-2000:]
    assert not [p for p in temp.iterdir() if p.is_dir()]  # (TensorFlow's autograph leaves .py files of its own)
    assert LiteRtModel(result.path).contract() == runner.contract()
