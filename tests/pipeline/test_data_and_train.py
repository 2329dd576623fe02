"""Data split and the XLA training loop on real digits."""

from __future__ import annotations

import numpy as np

from tfship.pipeline.data.splits import load_split_arrays, make_dataset


def test_split_is_stratified_seeded_and_disjoint(fast_config, splits):
    assert splits.summary() == {"train": 1168, "validation": 269, "test": 360}
    again = load_split_arrays(fast_config.data, fast_config.run.seed)
    np.testing.assert_array_equal(again.test.labels, splits.test.labels)
    assert splits.train.images.dtype == np.float32 and splits.train.images.shape[1:] == (8, 8, 1)
    assert 0.0 <= splits.train.images.min() and splits.train.images.max() <= 1.0
    for part in (splits.train, splits.validation, splits.test):
        assert set(np.unique(part.labels)) == set(range(10))
    train_rows = {row.tobytes() for row in splits.train.images}
    assert not any(row.tobytes() in train_rows for row in splits.test.images[:50])


def test_training_dataset_drops_the_partial_batch(splits):
    batches = list(make_dataset(splits.train, 64, training=True, seed=1))
    assert all(int(images.shape[0]) == 64 for images, _ in batches)
    assert len(batches) == len(splits.train) // 64


def test_train_step_traced_once_and_learns(trained):
    assert trained.train_step_traces == 1
    xla = trained.summary()["xla"]  # the bundled config forces the XLA step (the main job's contract)
    assert trained.jit_compile is True
    assert xla["reason"] == "XLA on: train.jit_compile = true" and xla["steps_per_second"] == {}
    assert trained.history[-1].loss < trained.history[0].loss
    assert trained.test_accuracy > 0.5
    assert trained.checkpoint_path.with_suffix(".index").exists()
