"""Client mistakes found by the attack round, each answered as a client mistake on a real server.

A version path in non-ASCII digits, an unbounded V2 `datatype`, a lowercase `bearer` scheme and a client that
resets its connection mid-body: each gets a bounded 4xx-class answer (or is accepted, for the scheme), never
a 200 from the wrong route nor an "unexpected REST error" incident in the server's log.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest
import requests

from tests.serving.conftest import MODEL
from tfship.core.errors import UnauthenticatedError
from tfship.serving.operations.security import AccessPolicy


@pytest.mark.parametrize("digit", ["%EF%BC%91", "%D9%A1"], ids=["fullwidth_1", "arabic_indic_1"])
def test_a_version_path_takes_ascii_digits_only(server, digit):
    """`int()` reads "１" and "١" as 1; TF Serving's route takes [0-9] only."""
    for method, path in (("POST", f"/v1/models/{MODEL}/versions/{digit}:predict"),
                         ("GET", f"/v1/models/{MODEL}/versions/{digit}")):
        answer = requests.request(method, server.rest_url + path, data='{"instances": []}', timeout=30)
        assert answer.status_code in (400, 404), (path, answer.status_code, answer.text[:200])
    assert requests.get(f"{server.rest_url}/v1/models/{MODEL}/versions/1", timeout=30).status_code == 200


def test_an_unsupported_v2_datatype_is_echoed_bounded(server):
    body = {"inputs": [{"name": "image", "shape": [1, 8, 8, 1], "datatype": "Q" * 1_000_000, "data": [0.0] * 64}]}
    answer = requests.post(f"{server.rest_url}/v2/models/{MODEL}/infer", data=json.dumps(body), timeout=60)
    assert answer.status_code == 400, answer.text[:300]
    assert "(1000000 chars)" in answer.text and len(answer.text) < 800, answer.text[:300]


def test_the_bearer_scheme_is_case_insensitive():
    policy = AccessPolicy(frozenset({"s3cret"}))
    for header in ("Bearer s3cret", "bearer s3cret", "BEARER s3cret", "  bearer   s3cret "):
        policy.check(header)
    for header in ("Basic s3cret", "bearer", "s3cret", "bearer other"):
        with pytest.raises(UnauthenticatedError):
            policy.check(header)


def test_a_client_reset_mid_body_is_no_incident_and_serving_goes_on(server):
    host, port = server.rest_url.removeprefix("http://").split(":")
    for _ in range(3):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: 1000000\r\n\r\n".encode() + b'{"instances": [' + b"0.5, " * 2000)
        time.sleep(0.2)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a RST
        sock.close()
    time.sleep(1.0)
    assert requests.get(f"{server.rest_url}/v1/models/{MODEL}", timeout=30).status_code == 200
    assert "unexpected REST error" not in server.stderr_tail(400)


@pytest.mark.parametrize("raw,error", [
    (b"GET /v1/models/" + b"A" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "LineTooLong"),
    (b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Type: \x00\x01\r\n\r\n", "BadHttpMessage"),
    (b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
     "BadHttpMessage"),
])
def test_a_request_aiohttp_cannot_parse_is_one_bounded_warning(server, raw, error):
    """aiohttp answers 400 and used to log ERROR with a traceback quoting the bad bytes."""
    host, port = server.rest_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        answer = sock.recv(4096)
    assert answer.split(b" ")[1] == b"400", answer[:200]
    time.sleep(0.5)
    lines = [line for line in server.stderr_tail(400).splitlines() if "aiohttp.server" in line]
    assert lines and f"answered HTTP 400: {error}" in lines[-1] and " WARNING " in lines[-1], lines[-3:]
    assert all(len(line) < 600 for line in lines)
    assert "Traceback" not in server.stderr_tail(400)
    assert requests.get(f"{server.rest_url}/v1/models/{MODEL}", timeout=30).status_code == 200


PYTHON_WORDS = ("sys.set_int_max_str_digits", "recursion", "unicode string", "400, message", "\n")


@pytest.mark.parametrize("path,body,headers,expected", [
    (f"/v1/models/{MODEL}:predict", b'{"instances": [' + b"7" * 5000 + b"]}", {},
     "JSON Parse error: an integer literal has more than 4300 digits"),
    (f"/v2/models/{MODEL}/infer", b'{"inputs": [{"data": ' + b"7" * 5000 + b"}]}", {},
     "inference request JSON does not parse: an integer literal has more than 4300 digits"),
    (f"/v2/models/{MODEL}/infer", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {},
     "inference request JSON does not parse: the document is nested too deeply"),
    (f"/v1/models/{MODEL}:predict", b"not gzip at all", {"Content-Encoding": "gzip"},
     "request body cannot be read (Content-Encoding: gzip): Can not decode content-encoding: gzip"),
])
def test_parse_errors_are_worded_for_the_client(server, path, body, headers, expected):
    """No Python internals in a 400: the digit limit's advice to call a Python function, recursion, aiohttp's
    exception repr."""
    answer = requests.post(server.rest_url + path, data=body, headers={"Content-Type": "application/json",
                                                                        **headers}, timeout=60)
    message = answer.json()["error"]
    assert (answer.status_code, message) == (400, expected)
    assert not any(word in message for word in PYTHON_WORDS)
