"""TF.js artifact: converted in `.venv-tfjs`, run in Node.js (CPU backend), compared by output name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from tfship.core.errors import ConversionError
from tfship.pipeline.conversion.artifacts import saved_model_runner
from tfship.pipeline.gate.compare import Tolerance, compare_output
from tfship.tfjs.convert import TfjsQuantization, convert_tfjs
from tfship.tfjs.node_runner import NodeGraphModelRunner
from tfship.tfjs.worker import name_outputs

OUTPUTS = ("class_id", "logits", "probabilities")


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    from tests.serving.model_factory import build_saved_model

    folder = tmp_path_factory.mktemp("tfjs") / "1"
    build_saved_model(folder, seed=3, onnx=False, tflite=False)
    return folder


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    images = load_digits().images.astype(np.float32)[:200, :, :, None] / 16.0
    return images


def _convert(saved_model: Path, out: Path, quantization: TfjsQuantization, digits: np.ndarray, timeout_s=240.0):
    return convert_tfjs(saved_model, out, quantization, {"image": digits[:4]}, OUTPUTS, timeout_s)


def test_name_outputs_keys_every_output_by_its_signature_name():
    written = {"signature": {"inputs": {}, "outputs": {
        "Identity_1:0": {"name": "Identity_1:0", "dtype": "DT_FLOAT"},
        "class_id": {"name": "Identity:0", "dtype": "DT_INT64"},
        "Identity_2:0": {"name": "Identity_2:0", "dtype": "DT_FLOAT"}}}}
    nodes = {"class_id": ("Identity:0", "DT_INT64"), "logits": ("Identity_1:0", "DT_FLOAT"),
             "probabilities": ("Identity_2:0", "DT_FLOAT")}
    named = name_outputs(written, nodes)["signature"]["outputs"]
    assert {k: v["name"] for k, v in named.items()} == {k: v[0] for k, v in nodes.items()}
    with pytest.raises(ValueError, match="DT_INT64"):
        name_outputs(written, {"logits": ("Identity:0", "DT_FLOAT")})
    with pytest.raises(ValueError, match="Identity_9:0"):
        name_outputs(written, {"logits": ("Identity_9:0", "DT_FLOAT")})


@pytest.mark.slow
def test_tfjs_graph_model_matches_the_saved_model_by_name_in_node(saved_model, digits, tmp_path):
    done = _convert(saved_model, tmp_path / "tfjs", TfjsQuantization.FLOAT32, digits)
    assert done.status == "produced", done.reason
    assert done.outputs == {"class_id": "Identity:0", "logits": "Identity_1:0", "probabilities": "Identity_2:0"}
    model_json = json.loads((tmp_path / "tfjs" / "model.json").read_text())
    assert sorted(model_json["signature"]["outputs"]) == sorted(OUTPUTS)
    assert done.size_bytes == sum(p.stat().st_size for p in (tmp_path / "tfjs").iterdir())
    assert done.versions["tensorflowjs"] == "4.22.0" and done.versions["tfjs-core"] == "4.22.0"
    assert (tmp_path / "tfjs.reproduce.sh").is_file() and not list(tmp_path.glob(".*"))
    reference = saved_model_runner(saved_model)({"image": digits})
    with NodeGraphModelRunner(tmp_path / "tfjs") as runner:
        got = runner({"image": digits})
        assert runner({"image": digits[:1]})["logits"].shape == (1, 10)  # dynamic batch
    assert got["class_id"].dtype == np.int64
    for name in OUTPUTS:
        scores = reference["logits"] if name == "class_id" else None  # tie-aware index comparison
        row = compare_output(name, got[name], reference[name], Tolerance(1e-5, 1e-5), scores)
        assert row.passed, row
    # The trap this guards: logits and probabilities share dtype and shape; swapped, the gate fails.
    assert not compare_output("logits", got["probabilities"], reference["logits"], Tolerance(1e-5, 1e-5)).passed


@pytest.mark.slow
def test_float16_weights_are_smaller_and_within_float16_tolerance(saved_model, digits, tmp_path):
    full = _convert(saved_model, tmp_path / "full", TfjsQuantization.FLOAT32, digits)
    half = _convert(saved_model, tmp_path / "half", TfjsQuantization.FLOAT16, digits)
    assert half.status == "produced", half.reason
    assert half.size_bytes < full.size_bytes
    reference = saved_model_runner(saved_model)({"image": digits})
    with NodeGraphModelRunner(tmp_path / "half") as runner:
        got = runner({"image": digits})
    assert compare_output("probabilities", got["probabilities"], reference["probabilities"],
                          Tolerance(1e-2, 1e-2)).passed


@pytest.mark.slow
def test_conversion_past_its_time_limit_is_killed_and_leaves_nothing(saved_model, digits, tmp_path):
    done = _convert(saved_model, tmp_path / "tfjs", TfjsQuantization.FLOAT32, digits, timeout_s=0.5)
    assert done.status == "crashed" and "timed out after 0.5 s" in done.reason
    assert done.path is None and not (tmp_path / "tfjs").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tfjs.reproduce.sh"]


@pytest.mark.slow
def test_node_runner_names_a_bad_request_and_keeps_serving(saved_model, digits, tmp_path):
    assert _convert(saved_model, tmp_path / "tfjs", TfjsQuantization.FLOAT32, digits).status == "produced"
    with NodeGraphModelRunner(tmp_path / "tfjs") as runner:
        with pytest.raises(ConversionError, match="unknown input \"pixels\""):
            runner({"pixels": digits[:2]})
        assert runner({"image": digits[:2]})["class_id"].shape == (2,)


def test_missing_saved_model_is_refused_by_name(tmp_path):
    with pytest.raises(ConversionError, match="saved_model.pb is missing"):
        convert_tfjs(tmp_path, tmp_path / "tfjs", TfjsQuantization.FLOAT32, {}, OUTPUTS, 10.0)
