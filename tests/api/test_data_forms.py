"""`tfship.ship(model, data)` takes data the Keras way: (x, y) with x an array, a list or a dict of named
arrays, a tf.data.Dataset of (x, y) batches; anything else is refused naming the accepted forms."""

from __future__ import annotations

import numpy as np
import pytest

import tfship
from tfship.core.errors import ConfigError
from tfship.pipeline.api.data_forms import model_input_names, named_arrays

ROWS = 12


def _two_inputs(rows: int = ROWS):
    rng = np.random.default_rng(0)
    x = {"dense": rng.random((rows, 3), dtype=np.float32), "item": rng.integers(0, 5, (rows,), dtype=np.int64)}
    return x, rng.integers(0, 2, rows).astype(np.int64)


def _two_input_model():
    import keras

    dense = keras.Input((3,), name="dense")
    item = keras.Input((), name="item", dtype="int64")
    embedded = keras.layers.Embedding(5, 2, name="item_embedding")(item)
    hidden = keras.layers.Concatenate()([dense, embedded])
    return keras.Model({"dense": dense, "item": item}, keras.layers.Dense(2, name="logits")(hidden), name="two")


def test_every_keras_form_gives_the_same_named_arrays():
    import tensorflow as tf

    x, y = _two_inputs()
    expected = {"dense": x["dense"], "item": x["item"], "y": y}
    by_dict = named_arrays((x, y))
    by_list = named_arrays(([x["dense"], x["item"]], y), ("dense", "item"))
    by_dataset = named_arrays(tf.data.Dataset.from_tensor_slices((x, y)).batch(5))  # 5 + 5 + 2 rows
    for arrays in (by_dict, by_list, by_dataset):
        assert sorted(arrays) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(arrays[name], value)
            assert arrays[name].dtype == value.dtype
    single = named_arrays((x["dense"], y))
    assert sorted(single) == ["x", "y"]
    assert sorted(named_arrays(tf.data.Dataset.from_tensor_slices(x["dense"]).batch(4))) == ["x"]
    assert sorted(named_arrays({**x, "y": y})) == ["dense", "item", "y"]  # the NPZ layout, as before


@pytest.mark.parametrize(("data", "names", "match"), [
    ("nope", None, "data is a str"),
    ([np.zeros((2, 3))], None, "data is a list; expected .*tf.data.Dataset of \\(x, y\\) batches"),
    ((object(), np.zeros(2)), None, "x is a object; expected"),
    (([np.zeros((2, 3))], np.zeros(2)), None, "input order is not known here; give x as a dict"),
    (([np.zeros((2, 3))], np.zeros(2)), ("a", "b"), "list of 1 arrays; the model has 2 inputs"),
    (({"y": np.zeros((2, 3))}, np.zeros(2)), None, "input named 'y', a label key"),
    (({"seq": [[1, 2], [3]]}, np.zeros(2)), None, "x\\['seq'\\] is ragged or mixed"),
    ((np.zeros((2, 3)), 1), None, "y is a scalar"),
])
def test_unaccepted_forms_are_refused_by_name(data, names, match):
    with pytest.raises(ConfigError, match=match):
        named_arrays(data, names)


def test_dataset_of_unbatched_or_endless_elements_is_refused():
    import tensorflow as tf

    x, y = _two_inputs()
    with pytest.raises(ConfigError, match="holds a scalar; expected \\(x, y\\) batches \\(call dataset.batch"):
        named_arrays(tf.data.Dataset.from_tensor_slices((x, y)))
    with pytest.raises(ConfigError, match="infinite"):
        named_arrays(tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat())
    with pytest.raises(ConfigError, match="empty"):
        named_arrays(tf.data.Dataset.from_tensor_slices((x, y)).batch(4).take(0))


def test_model_input_names_follow_the_keras_model():
    assert model_input_names(_two_input_model()) == ("dense", "item")
    assert model_input_names("model.keras") is None


def test_refused_data_leaves_nothing_written(tmp_path):
    with pytest.raises(ConfigError, match="input order is not known|list of 1 arrays"):
        tfship.ship(_two_input_model(), ([np.zeros((2, 3), np.float32)], np.zeros(2)), runs_dir=tmp_path / "runs",
                    repository=tmp_path / "models")
    assert not (tmp_path / "runs" / ".inputs").exists()


@pytest.mark.slow
def test_ship_takes_a_dict_of_named_arrays_with_labels(tmp_path):
    """The issue's case: `ship(model, (x_dict, y))` failed with 'Object arrays cannot be loaded'."""
    x, y = _two_inputs(64)
    result = tfship.ship(_two_input_model(), (x, y), runs_dir=tmp_path / "runs", repository=tmp_path / "models",
                         convert={"tflite_modes": ["float32"]})
    assert result.ok, result.errors
    with np.load(next((tmp_path / "runs" / ".inputs").rglob("data.npz")), allow_pickle=False) as saved:
        assert sorted(saved.files) == ["dense", "item", "y"]
    inspection = tfship.inspect(result.published)
    assert sorted(t["name"] for t in inspection.signatures["serving_default"]["inputs"]) == ["dense", "item"]
