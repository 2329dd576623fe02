"""Data as users hand it over: a rectangular object array of `str` (pandas' form for text) or `bytes` is a
string array, while ragged or mixed object arrays keep their refusal; a data frame (pandas is not installed
here: a stand-in with `columns`, `to_numpy()` and `__getitem__`) gives one array per column, named as the
model's inputs, as Keras' `fit` takes it."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import ConfigError
from tfship.pipeline.api.data_forms import named_arrays
from tfship.pipeline.export_only.user_model import load_user_data


class Column:
    """A pandas Series' part tfship uses."""

    def __init__(self, values):
        self.values = values

    def to_numpy(self):
        return self.values


class Frame:
    """A pandas DataFrame's part tfship uses: columns, to_numpy(), frame[column]."""

    def __init__(self, columns: dict):
        self.data = columns
        self.columns = list(columns)

    def __getitem__(self, name):
        return Column(self.data[name])

    def to_numpy(self):
        return np.stack([np.asarray(v) for v in self.data.values()], axis=1)


TEXT = np.array(["good film", "bad film", "fine"], dtype=object)  # pandas' text column


def test_object_array_of_str_or_bytes_is_a_string_array():
    arrays = named_arrays((TEXT, np.array([1, 0, 1])))
    assert arrays["x"].dtype.kind == "U" and arrays["x"].tolist() == TEXT.tolist()
    assert named_arrays({"x": np.array([b"a", b"bc"], dtype=object)})["x"].dtype.kind == "S"
    assert named_arrays({"x": np.array([["a", "b"], ["c", "d"]], dtype=object)})["x"].shape == (2, 2)


@pytest.mark.parametrize("values", [np.array(["a", 1], dtype=object), np.array(["a", b"b"], dtype=object),
                                    np.array([[1, 2], [3]], dtype=object), np.array([None, "a"], dtype=object)])
def test_mixed_or_ragged_object_arrays_keep_their_refusal(values):
    with pytest.raises(ConfigError, match=r"holds Python objects"):
        named_arrays((values, None))


def test_frame_gives_one_array_per_input_column():
    frame = Frame({"review": TEXT, "stars": np.array([5.0, 1.0, 3.0])})
    arrays = named_arrays((frame, Column(np.array([1, 0, 1]))), ("review", "stars"))
    assert sorted(arrays) == ["review", "stars", "y"] and arrays["review"].dtype.kind == "U"
    assert named_arrays((frame, None))["stars"].tolist() == [5.0, 1.0, 3.0]  # a file's inputs: columns as named
    with pytest.raises(ConfigError, match=r"columns \['review', 'stars'\]; the model's inputs are \['text', 'n'\]"):
        named_arrays((frame, None), ("text", "n"))


def test_single_input_model_takes_the_whole_frame():
    frame = Frame({"a": np.arange(3.0), "b": np.arange(3.0) * 2})
    arrays = named_arrays((frame, None), ("features",))
    assert arrays["x"].shape == (3, 2)


def test_text_column_reaches_a_string_input_of_shape_n_by_1(tmp_path):
    np.savez(tmp_path / "data.npz", **named_arrays((Frame({"review": TEXT}), np.array([1, 0, 1])), ("review",)))
    contract = Signature("serving_default", {"review": TensorSpec("string", (None, 1))}, {})
    data = load_user_data(tmp_path / "data.npz", contract, 2, 0)
    assert data.inputs["review"].shape == (3, 1) and data.inputs["review"][0, 0] == "good film"
