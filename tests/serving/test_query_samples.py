"""`query --samples`: a labelled NPZ or a published version's golden set; anything else refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.errors import ConfigError
from tfship.serving.query import samples_from_file


def test_labelled_samples_are_read_and_cut_to_count(tmp_path):
    path = tmp_path / "samples.npz"
    np.savez(path, image=np.arange(5 * 4, dtype=np.float32).reshape(5, 2, 2, 1), label=np.array([3, 1, 4, 1, 5]))
    images, labels = samples_from_file(path, 3)
    assert images.shape == (3, 2, 2, 1) and labels.dtype == np.int64 and labels.tolist() == [3, 1, 4]


def test_golden_set_uses_the_saved_models_class_ids_as_labels(tmp_path):
    path = tmp_path / "tfship_golden.npz"
    np.savez(path, **{"input:image": np.zeros((4, 8, 8, 1), np.float32), "output:class_id": np.array([7, 0, 2, 9]),
                      "output:logits": np.zeros((4, 10), np.float32)})
    images, labels = samples_from_file(path, 20)
    assert images.shape == (4, 8, 8, 1) and labels.tolist() == [7, 0, 2, 9]


def test_other_arrays_are_refused_naming_what_the_file_holds(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, x=np.zeros(3), y=np.zeros(3))
    with pytest.raises(ConfigError, match=r"other\.npz: need arrays 'image' and 'label'.*holds \['x', 'y'\]"):
        samples_from_file(path, 3)


def test_a_file_that_is_not_an_npz_is_refused_naming_it(tmp_path):
    path = tmp_path / "broken.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"broken\.npz: cannot read it as an \.npz"):
        samples_from_file(path, 3)
