"""`--data` for export-only runs: bad files and values stop with the file, row and value named."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.errors import DatasetError
from tfship.pipeline.export_only.user_model import load_user_data
from tfship.signatures.export import classifier_contract

CONTRACT = classifier_contract("image", (8, 8, 1), 10)
CLASSES = tuple(str(i) for i in range(10))


def _npz(path, x, y):
    np.savez(path, x=x, y=y)
    return path


def test_good_npz_loads_inputs_labels_and_calibration(tmp_path):
    x = np.random.default_rng(0).random((20, 8, 8, 1), dtype=np.float32)
    data = load_user_data(_npz(tmp_path / "ok.npz", x, np.arange(20) % 10), CONTRACT, 5, 0, CLASSES)
    assert data.inputs["image"].shape == (20, 8, 8, 1) and data.labels.dtype == np.int64
    assert data.calibration["image"].shape == (5, 8, 8, 1)


@pytest.mark.parametrize("bad_label", [42, -1])
def test_label_outside_declared_classes_is_refused(tmp_path, bad_label):
    labels = np.arange(12) % 10
    labels[7] = bad_label
    path = _npz(tmp_path / "labels.npz", np.zeros((12, 8, 8, 1), np.float32), labels)
    with pytest.raises(DatasetError) as error:
        load_user_data(path, CONTRACT, 4, 0, CLASSES)
    assert str(path) in str(error.value) and f"label {bad_label} at row 7" in str(error.value)


def test_nan_feature_is_refused_naming_the_row(tmp_path):
    x = np.zeros((6, 8, 8, 1), np.float32)
    x[4, 2, 2, 0] = np.nan
    path = _npz(tmp_path / "nan.npz", x, np.arange(6))
    with pytest.raises(DatasetError, match="NaN or Inf.*row 4"):
        load_user_data(path, CONTRACT, 4, 0, CLASSES)


def test_corrupt_npz_is_a_dataset_error(tmp_path):
    path = _npz(tmp_path / "corrupt.npz", np.zeros((6, 8, 8, 1), np.float32), np.arange(6))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match="cannot read NPZ"):
        load_user_data(path, CONTRACT, 4, 0, CLASSES)


def test_sequential_model_gets_a_contract():
    import keras

    from tfship.signatures.keras_export import contract_from_keras

    model = keras.Sequential([keras.Input((4,), name="features"), keras.layers.Dense(3, name="scores")])
    contract = contract_from_keras(model)
    assert list(contract.inputs) == ["features"]
    assert [(t.name, t.shape) for t in contract.outputs.values()] == [("scores", (None, 3))]


def test_image_folder_for_an_input_of_any_height_and_width_is_refused(tmp_path):
    """The folder's images are resized to the input's height and width: a model declaring neither gets the
    refusal naming the input, not TensorFlow's error on resizing to (None, None)."""
    import tensorflow as tf

    (tmp_path / "images" / "cat").mkdir(parents=True)
    png = tf.io.encode_png(np.zeros((4, 5, 3), np.uint8)).numpy()
    (tmp_path / "images" / "cat" / "a.png").write_bytes(png)
    contract = classifier_contract("image", (None, None, 3), 2)
    with pytest.raises(DatasetError) as error:
        load_user_data(tmp_path / "images", contract, 4, 0, ("cat", "dog"))
    assert "height and width fixed" in str(error.value) and "float32[?,?,?,3]" in str(error.value)
