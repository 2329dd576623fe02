"""A client string that no UTF-8 can hold (a lone UTF-16 surrogate escape, `\\ud800`) is refused at the JSON
parse with RapidJSON's words, on both REST APIs and every path that reads a string, never an HTTP 500.

Found by a QA attack round: the standard parser kept `\\ud800` as a Python string, and the 400 that echoed
it could not be encoded, so aiohttp answered 500; `:classify` failed on it inside the tf.Example builder.
TF Serving's RapidJSON refuses such a document (kParseErrorStringUnicodeSurrogateInvalid).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from conftest import MODEL

from tfship.serving.dataplane import json_numbers
from tfship.serving.launcher import ServerProcess

IMAGE = [[[0.0] for _ in range(8)] for _ in range(8)]
BODIES = [  # (route, raw body): a lone surrogate as a name, a value, a key, a feature, in both APIs
    (f"/v1/models/{MODEL}:predict", '{"signature_name": "\\ud800", "instances": [1]}'),
    (f"/v1/models/{MODEL}:predict", '{"instances": ["\\udfff"]}'),
    (f"/v1/models/{MODEL}:predict", '{"output_filter": ["\\ud800"], "instances": [' + json.dumps(IMAGE) + "]}"),
    (f"/v1/models/{MODEL}:predict", '{"instances": [{"\\ud800": 1}]}'),
    (f"/v1/models/{MODEL}:predict", '{"inputs": {"image": [' + json.dumps(IMAGE) + '], "x": "\\ud800"}}'),
    (f"/v1/models/{MODEL}:classify", '{"examples": [{"\\ud800": "\\ud800"}]}'),
    (f"/v1/models/{MODEL}:regress", '{"examples": [{"x": "\\udfff"}]}'),
    (f"/v2/models/{MODEL}/infer", '{"inputs": [{"name": "\\ud800", "shape": [1], "datatype": "FP32", "data": [1]}]}'),
    (f"/v2/models/{MODEL}/infer", '{"id": "\\udbff", "inputs": []}'),
]


@pytest.fixture(scope="module", params=["tflite", "onnx"])
def edge_server(request, repository):
    with ServerProcess(repository, MODEL, backend=request.param) as proc:
        yield proc


def _post(url: str, body: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _served(base: str) -> None:
    status, body = _post(f"{base}/v1/models/{MODEL}:predict", json.dumps({"instances": [IMAGE]}))
    assert status == 200, body


@pytest.mark.parametrize(("route", "body"), BODIES)
def test_lone_surrogate_is_400_with_rapidjsons_words(server, route, body):
    status, answer = _post(server.rest_url + route, body)
    assert status == 400, (status, answer[:300])
    assert b"surrogate pair in string is invalid" in answer
    answer.decode("utf-8")  # the error body itself is valid UTF-8
    _served(server.rest_url)


def test_every_backend_refuses_it_and_keeps_serving(edge_server):
    for route, body in BODIES:
        status, answer = _post(edge_server.rest_url + route, body)
        assert status == 400, (edge_server.backend, route, status, answer[:300])
    _served(edge_server.rest_url)


@pytest.mark.parametrize("raw", ['{"a": "\\ud800"}', '{"\\udfff": 1}', '{"a": [1, {"b": ["x\\uDBFFy"]}]}'])
def test_parser_refuses_lone_surrogates(raw):
    for text in (raw, raw.encode()):
        with pytest.raises(json_numbers.LoneSurrogateError):
            json_numbers.loads(text)


def test_parser_keeps_pairs_and_escaped_backslashes():
    """The check can pass: a valid pair is one code point, and `\\\\ud800` is six characters, not an escape."""
    assert json_numbers.loads('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}
    assert json_numbers.loads('{"a": "\\\\ud800"}') == {"a": "\\ud800"}
