"""`query --samples`: a labelled NPZ (digits `image`/`label`, or named inputs and `y`) or a published version's
golden set, read as named inputs; anything else refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.errors import ConfigError
from tfship.serving.query import samples_from_file


def test_labelled_samples_are_read_and_cut_to_count(tmp_path):
    path = tmp_path / "samples.npz"
    np.savez(path, image=np.arange(5 * 4, dtype=np.float32).reshape(5, 2, 2, 1), label=np.array([3, 1, 4, 1, 5]))
    inputs, labels = samples_from_file(path, 3)
    assert inputs["image"].shape == (3, 2, 2, 1) and labels.dtype == np.int64 and labels.tolist() == [3, 1, 4]


def test_named_inputs_with_y_are_read_as_the_ship_api_writes_them(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, price=np.ones((4, 3), np.float32), store=np.arange(4), y=np.array([0.5, 1.5, 2.5, 3.5]))
    inputs, labels = samples_from_file(path, 2)
    assert sorted(inputs) == ["price", "store"] and inputs["store"].tolist() == [0, 1]
    assert labels.dtype == np.float64 and labels.tolist() == [0.5, 1.5]  # float targets stay float


def test_golden_set_uses_the_saved_models_class_ids_as_labels(tmp_path):
    path = tmp_path / "tfship_golden.npz"
    np.savez(path, **{"input:image": np.zeros((4, 8, 8, 1), np.float32), "output:class_id": np.array([7, 0, 2, 9]),
                      "output:logits": np.zeros((4, 10), np.float32)})
    inputs, labels = samples_from_file(path, 20)
    assert list(inputs) == ["image"] and inputs["image"].shape == (4, 8, 8, 1) and labels.tolist() == [7, 0, 2, 9]


def test_other_arrays_are_refused_naming_what_the_file_holds(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, x=np.zeros(3), z=np.zeros(3))  # no labels
    with pytest.raises(ConfigError, match=r"other\.npz: need input arrays and labels.*holds \['x', 'z'\]"):
        samples_from_file(path, 3)


def test_a_file_that_is_not_an_npz_is_refused_naming_it(tmp_path):
    path = tmp_path / "broken.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"broken\.npz: cannot read it as an \.npz"):
        samples_from_file(path, 3)


def test_the_task_is_inferred_from_labels_and_outputs_and_scored_by_its_metric():
    from tfship.serving.query import _scored_output, infer_task

    logits = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]], np.float32)
    probability = np.array([[0.9], [0.2], [0.7]], np.float32)
    assert infer_task({"logits": logits, "class_id": np.array([0, 1, 1])}, np.array([0, 1, 1])) == "classification"
    assert infer_task({"probability": probability}, np.array([1, 0, 1])) == "binary"
    assert infer_task({"prediction": probability}, np.array([0.5, 1.0, 2.0])) == "regression"
    assert infer_task({"probability": probability}, np.array([1, 2, 0])) == "classification"  # not 0/1: no binary
    assert _scored_output("binary", {"probability": probability}, np.array([1, 0, 1])) is probability
    ids_only = _scored_output("classification", {"class_id": np.array([0, 1, 1])}, np.array([0, 1, 3]))
    assert ids_only.shape == (3, 4) and ids_only.argmax(axis=1).tolist() == [0, 1, 1]
    with pytest.raises(ConfigError, match="no output fits task 'regression'"):
        _scored_output("regression", {"logits": logits}, np.array([0.5, 1.0, 2.0]))
