"""Variants that must not be produced (refused, crashed, timed out) leave nothing half-written behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfship.core.errors import ConversionError
from tfship.tflite.convert import convert_tflite
from tfship.tflite.modes import TfliteMode, TfliteOptions
from tfship.tflite.worker import TEST_HOOK_ENV

TIMEOUT_S = 240.0


def _assert_nothing_left(folder: Path, name: str) -> None:
    """Only the reproduce script (and the representative inputs it reads) may remain."""
    left = sorted(p.name for p in folder.iterdir())
    allowed = {f"{name}.reproduce.sh", f"{name}.representative.npz"}
    assert set(left) <= allowed, left
    assert f"{name}.reproduce.sh" in left


def test_float16_overflow_is_a_warning_and_the_measured_gate_refuses_naming_the_output(tmp_path,
                                                                                     overflow_saved_model):
    """The static scan names what float16 cannot hold (a warning); the converter clamps it; the parity gate's
    measured comparison refuses the file, naming the outputs the overflow reaches."""
    from tfship.core.saved_model import read_signatures
    from tfship.pipeline.config import load_config
    from tfship.pipeline.conversion.artifacts import Artifact
    from tfship.pipeline.gate.validate import validate_artifacts

    result = convert_tflite(overflow_saved_model, tmp_path / "f16.tflite", TfliteOptions(TfliteMode.FLOAT16),
                            None, TIMEOUT_S)
    assert result.status == "produced", result.reason
    (warning,) = result.warnings
    assert "huge_dense" in warning and "kernel" in warning and "1e+06" in warning and "65504" in warning, warning
    assert "2 tensor(s)" in warning and "constant" in warning and "250000" in warning, warning
    rows = {"x": np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)}
    report = validate_artifacts(Artifact("saved_model", "saved_model", "float32", overflow_saved_model),
                                [Artifact("tflite_float16", "tflite", "float16", result.path)],
                                read_signatures(overflow_saved_model)["serving_default"], rows, None,
                                load_config().parity.model_copy(update={"task": "regression", "prediction_output": "y"}))
    row = report.rows[1]
    assert not row.passed, row
    assert "output 'y'" in row.reason and "output 'scaled'" in row.reason, row.reason


def test_float32_of_the_overflow_model_is_produced(tmp_path, overflow_saved_model):
    """The scan applies to float16 only: float32 holds 1e6 fine."""
    result = convert_tflite(overflow_saved_model, tmp_path / "f32.tflite", TfliteOptions(TfliteMode.FLOAT32),
                            None, TIMEOUT_S)
    assert result.status == "produced", result.reason


def test_flex_op_refused_without_allow_flex(tmp_path, flex_saved_model):
    result = convert_tflite(flex_saved_model, tmp_path / "flex.tflite", TfliteOptions(TfliteMode.FLOAT32),
                            None, TIMEOUT_S)
    assert result.status == "refused"
    assert "Cumprod" in result.reason and "allow_flex" in result.reason, result.reason
    assert result.flex_ops == ("FlexCumprod",)
    _assert_nothing_left(tmp_path, "flex.tflite")


def test_flex_artifact_refused_when_litert_cannot_run_it(tmp_path, flex_saved_model):
    """allow_flex converts with SELECT_TF_OPS, but ai_edge_litert has no Flex delegate: not produced."""
    options = TfliteOptions.from_mapping({"mode": "float32", "allow_flex": True})
    result = convert_tflite(flex_saved_model, tmp_path / "flex.tflite", options, None, TIMEOUT_S)
    assert result.status == "refused"
    assert result.flex_ops == ("FlexCumprod",)
    assert "FlexCumprod" in result.reason and "LiteRT" in result.reason, result.reason
    _assert_nothing_left(tmp_path, "flex.tflite")


@pytest.mark.parametrize(("hook", "step"), [("abort-convert", "convert"), ("abort-smoke", "LiteRT check")])
def test_worker_crash_reported_with_signal_name(tmp_path, monkeypatch, digits_saved_model, digits_data,
                                                hook, step):
    monkeypatch.setenv(TEST_HOOK_ENV, hook)
    result = convert_tflite(digits_saved_model, tmp_path / "crash.tflite", TfliteOptions(TfliteMode.FLOAT32),
                            {"image": digits_data["train_x"][:4]}, TIMEOUT_S)
    assert result.status == "crashed"
    assert "SIGABRT" in result.reason and step in result.reason, result.reason
    assert result.path is None
    _assert_nothing_left(tmp_path, "crash.tflite")


def test_timeout_reported_and_worker_killed(tmp_path, monkeypatch, digits_saved_model):
    monkeypatch.setenv(TEST_HOOK_ENV, "hang-convert")
    result = convert_tflite(digits_saved_model, tmp_path / "slow.tflite", TfliteOptions(TfliteMode.FLOAT32),
                            None, 4.0)
    assert result.status == "crashed"
    assert "timed out after 4 s" in result.reason, result.reason
    assert 4.0 <= result.seconds < 30.0
    _assert_nothing_left(tmp_path, "slow.tflite")


def test_stale_artifact_removed_when_variant_fails(tmp_path, digits_saved_model):
    stale = tmp_path / "i8.tflite"
    stale.write_bytes(b"an older artifact")
    result = convert_tflite(digits_saved_model, stale, TfliteOptions(TfliteMode.INT8),
                            {"pixels": np.zeros((4, 8, 8, 1), np.float32)}, TIMEOUT_S)  # not the signature's input
    assert result.status == "refused" and not stale.exists()


def test_int8_representative_inputs_must_match_signature(tmp_path, digits_saved_model):
    result = convert_tflite(digits_saved_model, tmp_path / "i8.tflite", TfliteOptions(TfliteMode.INT8),
                            {"pixels": np.zeros((4, 8, 8, 1), np.float32)}, TIMEOUT_S)
    assert result.status == "refused"
    assert "['image']" in result.reason and "['pixels']" in result.reason, result.reason


def test_caller_errors_raise(tmp_path, digits_saved_model):
    with pytest.raises(ConversionError, match="representative_inputs"):
        convert_tflite(digits_saved_model, tmp_path / "i8.tflite", TfliteOptions(TfliteMode.INT8), None, 10.0)
    with pytest.raises(ConversionError, match="no SavedModel"):
        convert_tflite(tmp_path / "missing", tmp_path / "x.tflite", TfliteOptions(TfliteMode.FLOAT32),
                       None, 10.0)
    with pytest.raises(ConversionError, match="timeout_s"):
        convert_tflite(digits_saved_model, tmp_path / "x.tflite", TfliteOptions(TfliteMode.FLOAT32), None, 0)


def test_float16_activation_overflow_is_a_warning_naming_the_tensor(tmp_path, activation_overflow_saved_model):
    """Weights fit float16, but the representative data drives `amplify`'s output to 1.6e5: produced (LiteRT on
    CPU computes it in float32), with a warning naming the activation for a float16 GPU delegate."""
    rows = {"x": np.full((40, 4), 400.0, np.float32)}
    result = convert_tflite(activation_overflow_saved_model, tmp_path / "f16.tflite",
                            TfliteOptions(TfliteMode.FLOAT16), rows, TIMEOUT_S)
    assert result.status == "produced", result.reason
    (warning,) = result.warnings
    assert "activation" in warning and "amplify" in warning and "65504" in warning, warning
    assert "160000" in warning and "40 representative rows" in warning, warning
    small = convert_tflite(activation_overflow_saved_model, tmp_path / "ok.tflite", TfliteOptions(TfliteMode.FLOAT16),
                           {"x": np.full((40, 4), 1.0, np.float32)}, TIMEOUT_S)
    assert small.status == "produced" and small.warnings == (), small
