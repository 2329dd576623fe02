"""TfliteOptions validation, and LiteRtModel's request checks, thread safety and TF-free import."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tfship.core.errors import ContractError, ConversionError, InvalidRequestError
from tfship.serving.runtimes.litert import LiteRtModel
from tfship.tflite.modes import TfliteMode, TfliteOptions

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_unknown_option_refused_naming_key_and_allowed():
    with pytest.raises(ConversionError) as caught:
        TfliteOptions.from_mapping({"mode": "int8", "calibration_steps": 10})
    message = str(caught.value)
    assert "calibration_steps" in message
    for allowed in ("mode", "representative_samples", "int8_io", "allow_flex"):
        assert allowed in message


@pytest.mark.parametrize(("values", "fragment"), [
    ({"mode": "int4"}, "int4"),
    ({}, "'mode'"),
    ({"mode": "int8", "representative_samples": 0}, "representative_samples"),
    ({"mode": "int8", "representative_samples": True}, "representative_samples"),
    ({"mode": "int8", "int8_io": "uint8"}, "uint8"),
    ({"mode": "float16", "int8_io": "int8"}, "needs mode 'int8'"),
    ({"mode": "float32", "allow_flex": "yes"}, "allow_flex"),
])
def test_invalid_option_values_refused(values, fragment):
    with pytest.raises(ConversionError, match=fragment):
        TfliteOptions.from_mapping(values)


def test_options_round_trip_and_enum():
    options = TfliteOptions.from_mapping({"mode": "int8", "int8_io": "int8", "representative_samples": 50})
    assert options.mode is TfliteMode.INT8 and options.mode == "int8"
    assert TfliteOptions.from_mapping(options.to_mapping()) == options
    assert TfliteOptions("dynamic_range").mode is TfliteMode.DYNAMIC_RANGE


@pytest.fixture(scope="module")
def float_runner(digits_variant) -> LiteRtModel:
    result = digits_variant("float32")
    assert result.status == "produced", result.reason
    return LiteRtModel(result.path, num_threads=1)


def test_runner_refuses_bad_requests(float_runner):
    image = np.zeros((2, 8, 8, 1), np.float32)
    with pytest.raises(InvalidRequestError, match="missing \\['image'\\]"):
        float_runner.run({})
    with pytest.raises(InvalidRequestError, match="unexpected \\['extra'\\]"):
        float_runner.run({"image": image, "extra": image})
    with pytest.raises(InvalidRequestError, match=r"shape \[2, 8, 7, 1\]"):
        float_runner.run({"image": np.zeros((2, 8, 7, 1), np.float32)})
    with pytest.raises(InvalidRequestError, match="rank|shape"):
        float_runner.run({"image": np.zeros((8, 8, 1), np.float32)})
    with pytest.raises(InvalidRequestError, match="dtype"):
        float_runner.run({"image": np.full((1, 8, 8, 1), "x")})


def test_runner_casts_float64_and_handles_batch_changes(float_runner, digits_data):
    images = digits_data["test_x"][:16]
    whole = float_runner.run({"image": images.astype(np.float64)})
    assert whole["logits"].dtype == np.float32
    for batch in (16, 1, 3):  # shrink and grow again
        part = float_runner.run({"image": images[:batch]})
        np.testing.assert_allclose(part["logits"], whole["logits"][:batch], rtol=1e-6, atol=1e-6)


def test_runner_shared_by_threads_gives_sequential_results(float_runner, digits_data):
    batches = [digits_data["test_x"][i:i + 1 + i % 5] for i in range(24)]
    sequential = [float_runner.run({"image": b})["logits"] for b in batches]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda b: float_runner.run({"image": b})["logits"], batches))
    for want, got in zip(sequential, threaded, strict=True):
        np.testing.assert_array_equal(got, want)


def test_runner_errors_for_missing_file_and_signature(tmp_path, digits_variant):
    with pytest.raises(ConversionError, match="does not exist"):
        LiteRtModel(tmp_path / "none.tflite")
    with pytest.raises(ContractError, match="no signature 'predict'"):
        LiteRtModel(digits_variant("float32").path).contract("predict")
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"not a flatbuffer at all")
    with pytest.raises(ConversionError, match="cannot load"):
        LiteRtModel(garbage)


def test_runner_and_inspect_import_without_tensorflow():
    code = ("import sys; import tfship.serving.runtimes.litert, tfship.tflite.inspect; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')); "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
