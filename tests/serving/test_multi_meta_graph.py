"""A TF1 / Estimator-style SavedModel (`serve`, `train` and `eval` MetaGraphs) is served from its `serve`
MetaGraph, as TF Serving does with its default `--saved_model_tags=serve`."""

from __future__ import annotations

import numpy as np

from tests.saved_models import tf1_expected, tf1_multi_meta_graph
from tfship.core.saved_model import read_signatures, serving_tags
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient


def test_server_serves_the_serve_meta_graph_of_a_tf1_export(tmp_path):
    version = tf1_multi_meta_graph(tmp_path / "repo" / "estimator" / "1")
    assert serving_tags(version) == ["serve"]
    assert set(read_signatures(version)) == {"serving_default"}
    features = np.random.default_rng(3).random((5, 4), dtype=np.float32)
    with (ServerProcess(tmp_path / "repo", "estimator", backend="saved_model") as server,
          PredictClient(server.grpc_target, timeout_s=30) as client):
        assert set(client.metadata("estimator")) == {"serving_default"}
        got = client.predict("estimator", {"features": features})
    expected = tf1_expected(features)
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["class_id"], expected["class_id"])
