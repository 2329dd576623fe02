"""Requests and files from a QA attack on the newest surfaces: each was a 500 or a traceback, now a 4xx or a
named refusal, and the server keeps serving (`tests/serving/test_fuzz.py` covers the generated kinds)."""

from __future__ import annotations

import gzip
import http.client
import json
from urllib.parse import urlsplit

import pytest
from conftest import MODEL

from tfship.core.errors import ConfigError
from tfship.serving.dataplane.batching_parameters import BatchingParameters
from tfship.serving.launcher import ServerProcess
from tfship.serving.operations.security import read_token_env, read_token_file
from tfship.serving.tfs.flags import monitoring_settings, ssl_settings

TOKEN = "reader-1"


@pytest.fixture(scope="module")
def guarded_server(repository, tmp_path_factory):
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    with ServerProcess(repository, MODEL, backend="tflite", extra_args=("--auth-token-file", str(tokens))) as server:
        yield server


def _send(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None) -> tuple[int, str]:
    """One request with headers sent as given (http.client writes str headers as latin-1 bytes)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request(method, parts.path, body=body, headers={"Authorization": f"Bearer {TOKEN}",
                                                                   **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def _image(first) -> list:
    rows = [[[0.0] for _ in range(8)] for _ in range(8)]
    rows[0][0] = [first]
    return rows


@pytest.mark.parametrize("path", ["/v2/health/live", "/v1/models/digits", "/monitoring/prometheus/metrics"])
def test_non_ascii_authorization_header_is_401_not_500(guarded_server, path):
    for url in (guarded_server.rest_url + path, guarded_server.metrics_url + "/metrics"):
        status, _ = _send(url, headers={"Authorization": f"Bearer {TOKEN}\xe9"})
        assert status == 401, url
    assert _send(guarded_server.rest_url + path)[0] == 200


@pytest.mark.parametrize("route", [f"/v2/models/{MODEL}/infer", f"/v1/models/{MODEL}:predict"])
@pytest.mark.parametrize(("encoding", "body"), [("gzip", b"notgzip"), ("deflate", b"xx")])
def test_body_that_does_not_decode_as_its_content_encoding_is_400(guarded_server, route, encoding, body):
    status, text = _send(guarded_server.rest_url + route, "POST", body, {"Content-Encoding": encoding})
    assert status == 400 and f"Content-Encoding: {encoding}" in json.loads(text)["error"]
    good = gzip.compress(json.dumps({"instances": [_image(0.5)]}).encode())
    assert _send(guarded_server.rest_url + f"/v1/models/{MODEL}:predict", "POST", good,
                 {"Content-Encoding": "gzip"})[0] == 200


def test_v2_bytes_value_that_is_not_text_is_400(guarded_server):
    body = b'{"inputs":[{"name":"image","datatype":"BYTES","shape":[1],"data":["\\ud800"]}]}'
    status, text = _send(guarded_server.rest_url + f"/v2/models/{MODEL}/infer", "POST", body)
    # refused at the parse since test_unencodable_strings' kind was fixed (RapidJSON's words, as TF Serving)
    assert status == 400 and "surrogate pair in string is invalid" in json.loads(text)["error"]


@pytest.mark.parametrize("digits", [400, 5000])  # beyond any float; beyond Python's int-string limit
def test_tf_rest_integer_beyond_any_float_is_400(guarded_server, digits):
    huge = "1" + "0" * digits
    for body in ('{"instances": [%s]}' % json.dumps(_image(7)).replace("7", huge, 1),
                 '{"inputs": {"image": [%s]}}' % json.dumps(_image(7)).replace("7", huge, 1)):
        status, text = _send(guarded_server.rest_url + f"/v1/models/{MODEL}:predict", "POST", body.encode())
        assert status == 400, text[:300]
        assert "error" in json.loads(text)


def test_token_file_byte_order_mark_is_not_part_of_the_token(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_bytes(b"\xef\xbb\xbftokA\r\ntokB\n")
    assert read_token_file(tokens, "--auth-token-file") == {"tokA", "tokB"}


@pytest.mark.parametrize("token", ["t\u00f6k\u00e9n", "tok\x07"])
def test_token_that_no_header_can_carry_is_refused_naming_the_line(tmp_path, token):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# ok\ngood\n{token}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 3: a token must be printable ASCII"):
        read_token_file(tokens, "--auth-token-file")


def test_config_files_that_are_not_utf8_are_refused_naming_the_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"cannot read --ssl_config_file .*bad\.txt"):
        ssl_settings(bad)
    with pytest.raises(ConfigError, match=r"cannot read --monitoring_config_file .*bad\.txt"):
        monitoring_settings(bad)
    with pytest.raises(ConfigError, match=r"cannot read batching parameters file .*bad\.txt"):
        BatchingParameters.from_file(bad)


@pytest.mark.parametrize("path", ["/v2/health/live", "/v1/models/digits", "/v2"])
def test_metrics_path_may_not_shadow_the_api(tmp_path, path):
    config = tmp_path / "monitoring.config"
    config.write_text(f'prometheus_config {{ enable: true path: "{path}" }}\n')
    with pytest.raises(ConfigError, match="would shadow them"):
        monitoring_settings(config)
    config.write_text('prometheus_config { enable: true path: "/ops/metrics" }\n')
    assert monitoring_settings(config) == {"prometheus_path": "/ops/metrics"}


def test_environment_tokens_follow_the_same_rule(monkeypatch):
    monkeypatch.setenv("TFSHIP_TEST_TOKENS", "alpha, beta")
    assert read_token_env("TFSHIP_TEST_TOKENS", "--auth-token-env") == {"alpha", "beta"}
    monkeypatch.setenv("TFSHIP_TEST_TOKENS", "alpha,b\u00e9ta")
    with pytest.raises(ConfigError, match="--auth-token-env TFSHIP_TEST_TOKENS: token 2"):
        read_token_env("TFSHIP_TEST_TOKENS", "--auth-token-env")


@pytest.mark.parametrize(("data", "depth"), [
    ([[0.0] * 64, [[[0.0]] * 8] * 8], "depth 1"),  # right count, one row flat under the batch dimension
    ([[[[0.0]] * 8] * 8, [[0.0] * 8] * 8], "depth 3"),  # one row nested as the shape, the other one level short
])
def test_v2_ragged_nested_data_is_400(guarded_server, data, depth):
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [2, 8, 8, 1], "data": data}]}
    status, text = _send(guarded_server.rest_url + f"/v2/models/{MODEL}/infer", "POST", json.dumps(body).encode())
    assert status == 400 and f"does not follow shape [2, 8, 8, 1]: at {depth}" in json.loads(text)["error"], text[:300]
    for good in ([0.0] * 128, [[[[0.0]] * 8] * 8] * 2):  # flat, and nested exactly as the shape
        body["inputs"][0]["data"] = good
        assert _send(guarded_server.rest_url + f"/v2/models/{MODEL}/infer", "POST",
                     json.dumps(body).encode())[0] == 200
