"""TF Serving's REST API on the second port: status, metadata, predict (row/columnar/b64), errors."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import MODEL, saved_model_outputs

from tfship.core.contract import Signature, TensorSpec
from tfship.serving.tfs.json_write import dumps
from tfship.serving.tfs.rest_json import request_inputs, response_json


def _http(url: str, body: dict | bytes | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_status_and_metadata(server):
    status, body = _http(f"{server.rest_url}/v1/models/{MODEL}")
    assert status == 200
    assert [(s["version"], s["state"]) for s in body["model_version_status"]] == [("1", "AVAILABLE"),
                                                                                  ("2", "AVAILABLE")]
    status, body = _http(f"{server.rest_url}/v1/models/{MODEL}/versions/1/metadata")
    assert status == 200 and body["model_spec"] == {"name": MODEL, "signature_name": "", "version": "1"}
    image = body["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["image"]
    assert image["dtype"] == "DT_FLOAT" and [d["size"] for d in image["tensor_shape"]["dim"]] == ["-1", "8", "8", "1"]


def test_predict_row_and_columnar_formats(server, repository, images):
    want = saved_model_outputs(repository / MODEL / "2", {"image": images})
    status, body = _http(f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": images.tolist()})
    assert status == 200 and len(body["predictions"]) == len(images)
    np.testing.assert_allclose([p["logits"] for p in body["predictions"]], want["logits"], rtol=1e-6)
    assert [p["class_id"] for p in body["predictions"]] == want["class_id"].tolist()

    status, body = _http(f"{server.rest_url}/v1/models/{MODEL}/labels/stable:predict",
                         {"signature_name": "serving_default", "inputs": {"image": images.tolist()}})
    assert status == 200
    want_v1 = saved_model_outputs(repository / MODEL / "1", {"image": images})
    np.testing.assert_allclose(body["outputs"]["probabilities"], want_v1["probabilities"], rtol=1e-6)

    status, body = _http(f"{server.rest_url}/v1/models/{MODEL}/versions/1:predict",
                         {"signature_name": "scale", "instances": [{"x": [1, 2, 3]}]})
    assert status == 200 and body["predictions"] == [[2.0, 4.0, 6.0]], (body, server.stderr_tail())


@pytest.mark.parametrize(("path", "body", "code", "fragment"), [
    ("/v1/models/nope:predict", {"instances": [[0]]}, 404, "nope"),
    (f"/v1/models/{MODEL}/versions/9:predict", {"instances": [[0]]}, 404, "9"),
    (f"/v1/models/{MODEL}:predict", {"instances": [[[[0.0]]]]}, 400, "declared shape float32[?,8,8,1]"),
    (f"/v1/models/{MODEL}:predict", {"instances": [[[0.0]]]}, 400, "expected rank 4"),  # contract.KERNEL_RANK
    (f"/v1/models/{MODEL}:predict", {"instances": [], "inputs": []}, 400, "only one of 'inputs' or 'instances'"),
    (f"/v1/models/{MODEL}:predict", b"{not json", 400, "JSON Parse error"),
    (f"/v1/models/{MODEL}:predict", {"signature_name": "nope", "instances": [[0]]}, 400, "nope"),
    (f"/v1/models/{MODEL}:classify", {"examples": []}, 400, "'examples' value is an empty array"),
    (f"/v1/models/{MODEL}:regress", {"examples": [{"x": 1.0}]}, 400, "Expected one output Tensor."),
    (f"/v1/models/{MODEL}:regress", {"examples": [{"x": 1.0}], "signature_name": "nope"}, 400,
     "No signature was found with the name: nope"),
])
def test_errors_are_json_with_status(server, images, path, body, code, fragment):
    status, answer = _http(server.rest_url + path, body)
    assert status == code and fragment in answer["error"]
    status, _ = _http(f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": images.tolist()})
    assert status == 200


def test_b64_strings_decode_and_encode():
    signature = Signature("s", inputs={"text": TensorSpec("string", (None,)), "n": TensorSpec("int64", (None,))},
                          outputs={})
    raw = b"\xff\x00bytes"
    arrays, rows = request_inputs({"instances": [{"text": {"b64": base64.b64encode(raw).decode()}, "n": 3},
                                          {"text": "plain", "n": 4}]}, signature)
    assert rows and arrays["text"].tolist() == [raw, b"plain"] and arrays["n"].dtype == np.int64
    encoded = response_json({"text": np.array([raw, b"ok"], dtype=object)}, rows=False)
    assert json.loads(dumps(encoded)) == {"outputs": [{"b64": base64.b64encode(raw).decode()}, "ok"]}
