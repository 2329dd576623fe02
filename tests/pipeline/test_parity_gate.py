"""The parity gate on real artifacts: a correct ONNX passes; ONNX files broken on purpose
(outputs renamed into each other's places, a NaN weight, a perturbed weight) are refused with the
artifact, output and error named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tfship.core.errors import ParityError
from tfship.onnx_format.convert import convert_to_onnx
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.validate import raise_if_failed, validate_artifacts


@pytest.fixture(scope="module")
def onnx_file(exported, splits):
    folder, contract, _ = exported
    path = folder / "model.onnx"
    result = convert_to_onnx(folder, path, contract, 17, {"image": splits.test.images[:4]}, 300)
    assert result.size_bytes > 0 and (folder / "model.onnx.reproduce.sh").exists()
    return path


def _variant(source, folder, edit):
    """A broken copy served like any artifact: `<folder>/model.onnx`, named after its folder."""
    model = onnx.load(str(source))
    edit(model)
    folder.mkdir()
    onnx.save(model, str(folder / "model.onnx"))
    return Artifact(folder.name, "onnx", "float32", folder / "model.onnx")


def _validate(exported, splits, *candidates, required=()):
    folder, contract, _ = exported
    settings = load_config().parity
    return validate_artifacts(Artifact("saved_model", "saved_model", "float32", folder), list(candidates), contract,
                              {"image": splits.test.images[:100]}, splits.test.labels[:100], settings, required)


def test_correct_onnx_passes_at_every_batch_size(exported, splits, onnx_file):
    report = raise_if_failed(_validate(exported, splits, Artifact("onnx", "onnx", "float32", onnx_file)))
    onnx_row = report.rows[1]
    assert onnx_row.passed and onnx_row.batch_sizes == (1, 7, 64)
    assert {o.output for o in onnx_row.outputs} == {"logits", "probabilities", "class_id"}
    assert all(o.max_abs_error < 1e-4 for o in onnx_row.outputs if o.output != "class_id")


def test_swapped_output_names_are_caught(exported, splits, onnx_file, tmp_path):
    def swap(model):
        names = {"logits": "probabilities", "probabilities": "logits"}
        for node in model.graph.node:
            node.output[:] = [names.get(n, n) for n in node.output]
            node.input[:] = [names.get(n, n) for n in node.input]
        for output in model.graph.output:
            output.name = names.get(output.name, output.name)

    report = _validate(exported, splits, _variant(onnx_file, tmp_path / "swapped", swap), required=("swapped",))
    row = report.rows[1]
    assert not row.passed and "output 'logits'" in row.reason and "output 'probabilities'" in row.reason
    with pytest.raises(ParityError, match="swapped"):
        raise_if_failed(report)


def _edit_first_weight(function):
    def edit(model):
        weight = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
        array = numpy_helper.to_array(weight).copy()
        function(array)
        weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    return edit


def test_nan_weight_is_caught(exported, splits, onnx_file, tmp_path):
    def poison(array):
        array.flat[0] = np.nan

    report = _validate(exported, splits, _variant(onnx_file, tmp_path / "nan", _edit_first_weight(poison)))
    assert not report.rows[1].passed and "NaN" in report.rows[1].reason


def test_small_perturbation_fails_float32_tolerance(exported, splits, onnx_file, tmp_path):
    def nudge(array):
        array += 1e-3

    report = _validate(exported, splits, _variant(onnx_file, tmp_path / "nudged", _edit_first_weight(nudge)))
    row = report.rows[1]
    assert not row.passed and "outside atol 1e-05" in row.reason
