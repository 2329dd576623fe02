"""Input values a backend refuses while running (embedding ids outside the table) are INVALID_ARGUMENT.

TF Serving answers TensorFlow's InvalidArgumentError with INVALID_ARGUMENT and TensorFlow's message;
tfship does the same for every backend (TensorFlow, ONNX Runtime, LiteRT), naming the input, and keeps
INTERNAL for real server faults. Each backend is served by a real server on loopback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from typed_models import TABLE, build_typed_model

from tfship.serving.launcher import ServerProcess
from tfship.serving.runtimes.onnx import _is_input_error
from tfship.serving.tfs.client import PredictClient, RemoteError

MODEL = "typed"
BACKEND_WORDS = {"saved_model": "TensorFlow", "onnx": "ONNX Runtime", "tflite": "LiteRT"}
# The backend's own words for an id past the 10-row table.
OUT_OF_TABLE = {
    "saved_model": "indices[0,1] = {bad} is not in [0, 10)",
    "onnx": "INVALID_ARGUMENT : Non-zero status code returned while running Gather node",
    "tflite": "gather index out of bounds",
}
# A second bad id per backend: negative for TensorFlow and LiteRT; ONNX Gather wraps [-10, -1] by its
# specification, so its refused negative id is -11.
SECOND_BAD_ID = {"saved_model": -1, "onnx": -11, "tflite": -1}


@pytest.fixture(scope="module")
def typed_repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("typed")
    build_typed_model(repo / MODEL / "1")
    return repo


@pytest.fixture(scope="module", params=["saved_model", "onnx", "tflite"])
def backend_server(request, typed_repository):
    with ServerProcess(typed_repository, MODEL, backend=request.param,
                       extra_args=("--file-system-poll-wait-seconds", "0")) as server:
        yield request.param, server


def _rest(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("bad_id", ["past_table", "second"])
def test_backend_refusal_is_invalid_argument_naming_the_input(backend_server, bad_id):
    backend, server = backend_server
    bad = 10 if bad_id == "past_table" else SECOND_BAD_ID[backend]
    ids = np.array([[1, bad, 2]], dtype=np.int32)
    with PredictClient(server.grpc_target, timeout_s=30) as client:
        with pytest.raises(RemoteError) as caught:
            client.predict(MODEL, {"ids": ids})
        assert caught.value.grpc_code == "INVALID_ARGUMENT", caught.value
        message = caught.value.details
        assert message.startswith(f"{BACKEND_WORDS[backend]} rejected the value of input(s) ['ids'] while running "
                                  "the model: "), message
        if bad == 10 or backend != "onnx":
            assert OUT_OF_TABLE[backend].format(bad=bad) in message, message
        if backend == "onnx":
            assert f"idx={bad} must be within the inclusive range [-10,9]" in message, message
        assert "internal server error" not in message
        # The server keeps serving: a good id right after answers the table's row.
        good = client.predict(MODEL, {"ids": np.array([[0, 9, 3]], dtype=np.int32)})
        np.testing.assert_array_equal(good["vectors"], TABLE[[[0, 9, 3]]])
    status, body = _rest(f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [[1, bad, 2]]})
    assert status == 400 and body["error"] == message


def test_onnx_runtime_faults_that_are_not_input_errors_stay_internal():
    class Fail(Exception):
        pass

    invalid = type("InvalidArgument", (Exception,), {})("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : x")
    index = type("RuntimeException", (Exception,), {})("GatherND: invalid indice found, indice = 10")
    other = type("RuntimeException", (Exception,), {})("CUDA failure 2: out of memory")
    assert _is_input_error(invalid) and _is_input_error(index)
    assert not _is_input_error(other) and not _is_input_error(Fail("indices out of bounds"))
