"""`tfship run --model` on a TF1 / Estimator-style SavedModel (serve + train + eval MetaGraphs): the `serve`
MetaGraph is exported without its training state and published; `--tags` picks another MetaGraph."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.pipeline.conftest import run_tfship
from tests.saved_models import tf1_expected, tf1_multi_meta_graph


@pytest.fixture(scope="module")
def estimator(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimator")
    features = np.random.default_rng(5).random((60, 4), dtype=np.float32)
    np.savez(root / "data.npz", features=features, y=tf1_expected(features)["class_id"])
    return tf1_multi_meta_graph(root / "saved_model"), root / "data.npz"


@pytest.mark.slow
def test_run_publishes_the_serve_meta_graph_without_training_state(estimator, tmp_path):
    source, data = estimator
    completed = run_tfship("run", "--model", str(source), "--data", str(data), "--runs-dir", str(tmp_path / "runs"),
                           "--repository", str(tmp_path / "models"), "--set", "run.model_name=estimator",
                           "--set", 'convert.tflite_modes=["float32"]')
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    manifest = json.loads((tmp_path / "models" / "estimator" / "1" / "manifest.json").read_text())
    assert sorted(v["name"] for v in manifest["audit"]["variables"]) == ["b", "w"]
    assert manifest["parity"]["reference_metric"] == 100.0
    (run,) = (tmp_path / "runs").iterdir()
    left_out = json.loads((run / "data.json").read_text())
    assert left_out["tags"] == ["serve"] and "global_step:0" in left_out["variables_left_out"]


def test_tags_choose_another_meta_graph(estimator, tmp_path):
    source, data = estimator
    completed = run_tfship("run", "--model", str(source), "--data", str(data), "--tags", "eval",
                           "--runs-dir", str(tmp_path / "runs"), "--repository", str(tmp_path / "models"))
    assert completed.returncode == 2
    assert "MetaGraph tagged ['eval'] has no 'serving_default' signature; it has ['eval']" in completed.stderr
    completed = run_tfship("run", "--model", str(source), "--data", str(data), "--tags", "serve,gpu",
                           "--runs-dir", str(tmp_path / "runs"), "--repository", str(tmp_path / "models"))
    assert completed.returncode == 2 and "tag-sets [['train'], ['serve'], ['eval']]" in completed.stderr
