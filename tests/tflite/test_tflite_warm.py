"""The convert stage's warm TFLite child (`core.warm_children`): the four modes share one TensorFlow start, and
a conversion that kills or breaks its child costs that artifact only: the child is started again for the next
mode, the others (and ONNX) are produced, nothing half-written stays, and no child outlives the stage."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tfship.core.processes import pid_running
from tfship.core.saved_model import read_signatures
from tfship.core.warm_children import warm_children
from tfship.pipeline.config import ConvertSection
from tfship.pipeline.conversion.convert import convert_artifacts
from tfship.tflite.convert import convert_tflite
from tfship.tflite.modes import TfliteMode, TfliteOptions
from tfship.tflite.worker import TEST_HOOK_ENV

MODES = ("float32", "float16", "dynamic_range", "int8")


def _convert(tmp_path: Path, saved_model: Path, data) -> tuple[dict, Path]:
    version = tmp_path / "1"
    shutil.copytree(saved_model, version)
    contract = read_signatures(version)["serving_default"]
    result = convert_artifacts(version, contract, ConvertSection(tflite_modes=MODES, timeout_seconds=300),
                               {"image": data["train_x"][:100]}, {"image": data["test_x"][:8]})
    return {o.name: o for o in result.outcomes}, version


def test_modes_share_one_warm_child(tmp_path, digits_saved_model, digits_data):
    with warm_children() as pool:  # held open around the stage's own block, so it can be counted here
        outcomes, _ = _convert(tmp_path, digits_saved_model, digits_data)
        started, pids = pool.started, pool.pids()
    assert {name: o.status for name, o in outcomes.items()} == {"onnx": "produced", **{
        f"tflite_{mode}": "produced" for mode in MODES}}, outcomes
    assert started == 1, "eight worker steps (convert and LiteRT check per mode) in one child"
    assert pids and not any(pid_running(pid) for pid in pids)


@pytest.mark.parametrize(("hook", "words"), [("kill", "died with SIGKILL (signal 9)"),
                                             ("raise", "exited with status 1 and no report")])
def test_a_crash_in_one_mode_costs_that_artifact_only(tmp_path, monkeypatch, digits_saved_model, digits_data,
                                                      hook, words):
    monkeypatch.setenv(TEST_HOOK_ENV, f"{hook}-convert@float16")
    with warm_children() as pool:
        outcomes, version = _convert(tmp_path, digits_saved_model, digits_data)
        started, pids = pool.started, pool.pids()
    crashed = outcomes.pop("tflite_float16")
    assert crashed.status == "crashed" and words in crashed.reason and "convert worker" in crashed.reason, crashed
    assert all(o.status == "produced" for o in outcomes.values()), outcomes
    assert started == 2, "the crashed mode's child is replaced for the modes after it"
    assert not (version / "model_float16.tflite").exists() and not list(version.glob(".*"))
    for name in ("model.tflite", "model_dynamic_range.tflite", "model_int8.tflite", "model.onnx"):
        assert (version / name).is_file(), name
    assert pids and not any(pid_running(pid) for pid in pids)  # nothing outlives the stage


def test_a_hang_in_a_warm_child_is_timed_out(tmp_path, monkeypatch, digits_saved_model):
    monkeypatch.setenv(TEST_HOOK_ENV, "hang-convert")
    with warm_children() as pool:
        result = convert_tflite(digits_saved_model, tmp_path / "slow.tflite", TfliteOptions(TfliteMode.FLOAT32),
                                None, 4.0)
        pids = pool.pids()
    assert result.status == "crashed" and "timed out after 4 s" in result.reason, result.reason
    assert 4.0 <= result.seconds < 30.0
    assert not (tmp_path / "slow.tflite").exists()
    assert not any(pid_running(pid) for pid in pids)
