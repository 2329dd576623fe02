"""A malformed request never takes the SavedModel backend down (serving.dataplane.contract.KERNEL_RANK).

The SavedModel backend lets the model judge a request's shape, as TF Serving does. TensorFlow's oneDNN kernels
(on by default on recent Intel CPUs; the server here turns them on whatever the CPU) abort the process on a
wrong rank: a rank-2 tensor into a Conv2D ended the server with `Check failed: ... MklDnnConvUtil`. Each model
here is a real SavedModel whose op is such a kernel (a convolution, a max pool, a grouped convolution with a
bias, which TensorFlow fuses and can run only with oneDNN); each malformed request must come back
INVALID_ARGUMENT / 400 naming the input, and the server must answer the next good request.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import requests

from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient, RemoteError

MODELS = {"conv": 1, "pool": 1, "grouped": 4}  # name: input channels
MALFORMED = (np.zeros((1, 2), np.float32), np.zeros((2,), np.float32), np.zeros((1, 8, 8, 1, 1), np.float32))


def _good(model: str) -> np.ndarray:
    return np.random.default_rng(0).random((1, 8, 8, MODELS[model]), dtype=np.float32)


def _save(folder: Path, op: str) -> None:
    import tensorflow as tf

    channels = MODELS[op]

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.kernel = tf.Variable(tf.random.stateless_normal((3, 3, 1, 4), seed=(1, 2)))
            self.bias = tf.Variable(tf.ones((4,)))

        @tf.function(input_signature=[tf.TensorSpec((None, 8, 8, channels), tf.float32, name="image")])
        def serve(self, image):
            if op == "pool":
                return {"features": tf.nn.max_pool2d(image, 2, 2, "VALID")}
            # conv: 1 channel in; grouped: 4 channels in, a depth-1 filter, so 4 groups (ConvNeXt's depthwise)
            return {"features": tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(image, self.kernel, 1, "SAME"), self.bias))}

    model = Model()
    tf.saved_model.save(model, str(folder), signatures={"serving_default": model.serve})


@pytest.fixture(scope="module")
def kernel_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("kernels")
    for name in MODELS:
        _save(repository / name / "1", name)
    config = repository / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{repository / name}" model_platform: "tensorflow" }}\n'
        for name in MODELS) + "}\n")
    # oneDNN on whatever the CPU (TensorFlow turns it on by default only on recent Intel ones): its kernels are
    # what aborted, and only they run a grouped convolution fused with its bias.
    with ServerProcess(repository, next(iter(MODELS)), backend="saved_model",
                       extra_args=("--model-config-file", str(config)),
                       env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"}) as server:
        yield server


@pytest.mark.parametrize("model", MODELS)
def test_malformed_shapes_are_refused_over_grpc_and_the_server_goes_on(kernel_server, model):
    with PredictClient(kernel_server.grpc_target, timeout_s=60) as client:
        for bad in MALFORMED:
            with pytest.raises(RemoteError) as refused:
                client.predict(model, {"image": bad})
            assert refused.value.grpc_code == "INVALID_ARGUMENT", refused.value
            assert len(str(refused.value)) < 2100
            assert client.predict(model, {"image": _good(model)})["features"].shape[0] == 1
    assert kernel_server.process.poll() is None


@pytest.mark.parametrize("model", MODELS)
def test_malformed_shapes_are_refused_over_rest_and_the_server_goes_on(kernel_server, model):
    url = f"{kernel_server.rest_url}/v1/models/{model}:predict"
    for bad in MALFORMED:
        answer = requests.post(url, data=json.dumps({"inputs": {"image": bad.tolist()}}), timeout=60)
        assert answer.status_code == 400, answer.text
        assert "image" in answer.json()["error"]
        good = requests.post(url, data=json.dumps({"instances": _good(model).tolist()}), timeout=60)
        assert good.status_code == 200, good.text
    assert kernel_server.process.poll() is None


def test_an_op_this_build_cannot_run_is_unimplemented_naming_the_node(tmp_path):
    """Without oneDNN, TensorFlow cannot run the grouped convolution fused with its bias: the request answers
    UNIMPLEMENTED / 501 with TensorFlow's cause and the node (as TF Serving passes the code on), never
    INTERNAL, and the server answers the next request to another model."""
    for name in ("grouped", "conv"):
        _save(tmp_path / name / "1", name)
    config = tmp_path / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{tmp_path / name}" model_platform: "tensorflow" }}\n'
        for name in ("grouped", "conv")) + "}\n")
    with ServerProcess(tmp_path, "grouped", backend="saved_model", extra_args=("--model-config-file", str(config)),
                       env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0"}) as server:
        with PredictClient(server.grpc_target, timeout_s=60) as client:
            with pytest.raises(RemoteError) as refused:
                client.predict("grouped", {"image": _good("grouped")})
            assert refused.value.grpc_code == "UNIMPLEMENTED", refused.value
            assert "grouped convolutions" in str(refused.value) and "(node " in str(refused.value), refused.value
            assert client.predict("conv", {"image": _good("conv")})["features"].shape == (1, 8, 8, 4)
        answer = requests.post(f"{server.rest_url}/v1/models/grouped:predict",
                               data=json.dumps({"instances": _good("grouped").tolist()}), timeout=60)
        assert answer.status_code == 501 and "grouped convolutions" in answer.json()["error"], answer.text
        assert server.process.poll() is None
