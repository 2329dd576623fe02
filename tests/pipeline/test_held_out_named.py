"""Held-out rows of named inputs ({input name: [N, ...]}): `tfship query --run` on a run whose export has not written
held_out.npz yet (its config's splits), and `tfship promote --label stable`'s evidence (`held_out_digits`), are
sliced per input, not as one array (slicing the dict raised TypeError)."""

from __future__ import annotations

import numpy as np

from tfship.pipeline.data import splits as splits_module
from tfship.pipeline.data.split_types import ArraySplit, DatasetSplits
from tfship.pipeline.orchestration import chain, resume
from tfship.pipeline.orchestration.held_out import held_out_rows

INPUTS = {"user": np.arange(5, dtype=np.int64), "text": np.array(["a", "b", "c", "d", "e"])}
LABELS = np.array([0, 1, 0, 1, 1])


def _named_splits() -> DatasetSplits:
    test = ArraySplit(dict(INPUTS), LABELS)
    return DatasetSplits(test, test, test, ("0", "1"), task="binary")


def test_query_rows_of_a_named_run_before_its_export(monkeypatch, tmp_path):
    monkeypatch.setattr(resume, "resolve_run", lambda run, runs_dir: tmp_path)
    monkeypatch.setattr(resume, "stored_config", lambda folder: None)
    monkeypatch.setattr(chain, "load_run_data", lambda config, folder: _named_splits())
    inputs, labels = held_out_rows(3, run=tmp_path)
    assert sorted(inputs) == ["text", "user"]
    np.testing.assert_array_equal(inputs["user"], INPUTS["user"][:3])
    np.testing.assert_array_equal(inputs["text"], INPUTS["text"][:3])
    np.testing.assert_array_equal(labels, LABELS[:3])


def test_promote_evidence_rows_of_named_inputs(monkeypatch):
    monkeypatch.setattr(splits_module, "load_split_arrays", lambda data, seed, cache_dir=None: _named_splits())
    images, labels = splits_module.held_out_digits(2)
    assert isinstance(images, dict) and sorted(images) == ["text", "user"]
    np.testing.assert_array_equal(images["user"], INPUTS["user"][:2])
    np.testing.assert_array_equal(labels, LABELS[:2])
