"""core.files.write_npz: np.savez's archive, keyed by any name (np.savez's own keywords included)."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.files import write_npz


def test_names_that_are_np_savez_keywords_are_stored(tmp_path):
    arrays = {"file": np.arange(3), "allow_pickle": np.ones((2, 2), np.float32), "y": np.array([1, 0])}
    with pytest.raises(TypeError):  # what the pipeline called before: an input named `file` refused
        np.savez(tmp_path / "savez.npz", **arrays)
    path = tmp_path / "held_out.npz"
    write_npz(path, arrays)
    with np.load(path) as loaded:
        assert sorted(loaded.files) == ["allow_pickle", "file", "y"]
        for name, array in arrays.items():
            np.testing.assert_array_equal(loaded[name], array)
            assert loaded[name].dtype == array.dtype


def test_same_archive_as_np_savez(tmp_path):
    arrays = {"input:x": np.linspace(0, 1, 6).reshape(2, 3), "text": np.array(["a", "bc"]),
              "objects": np.array([b"a", None], dtype=object)}
    np.savez(tmp_path / "reference.npz", **arrays)
    write_npz(tmp_path / "written", arrays)  # `.npz` appended, as np.savez does
    with np.load(tmp_path / "reference.npz", allow_pickle=True) as reference, \
            np.load(tmp_path / "written.npz", allow_pickle=True) as written:
        assert written.files == reference.files
        for name in reference.files:
            np.testing.assert_array_equal(written[name], reference[name])
            assert written[name].dtype == reference[name].dtype
