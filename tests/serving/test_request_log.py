"""Request logging: one structured line per sampled request on gRPC and REST, off by default."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import requests
from conftest import MODEL

from tfship.serving import cli
from tfship.serving.launcher import ServerProcess
from tfship.serving.operations.request_log import RequestLog
from tfship.serving.tfs.client import PredictClient, RemoteError


def _request_lines(server) -> list[dict]:
    lines = []
    for line in server.stderr_tail(400).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("logger") == "tfship.requests":
            lines.append(entry)
    return lines


def _fields(entry: dict) -> dict:
    return {k: entry[k] for k in ("protocol", "method", "model", "version", "signature", "status", "http_status",
                                  "batch_rows")}


@pytest.fixture(scope="module")
def logging_server(repository):
    with ServerProcess(repository, MODEL, extra_args=("--request-log-sampling-rate", "1", "--json-logs",
                                                      "--file-system-poll-wait-seconds", "0")) as server:
        yield server


def test_every_request_logged_once_with_its_fields(logging_server, images):
    with PredictClient(logging_server.grpc_target) as client:
        client.predict(MODEL, {"image": images}, version=2, convert_dtypes=False)
        with pytest.raises(RemoteError):
            client.predict(MODEL, {"image": images[:, :4]}, convert_dtypes=False)
    ok = requests.post(f"{logging_server.rest_url}/v1/models/{MODEL}:predict",
                       data=json.dumps({"instances": images[:2].tolist()}), timeout=30)
    missing = requests.post(f"{logging_server.rest_url}/v1/models/nope:predict", data='{"instances": [1]}', timeout=30)
    bad = requests.post(f"{logging_server.rest_url}/v1/models/{MODEL}:predict", data="{", timeout=30)
    assert (ok.status_code, missing.status_code, bad.status_code) == (200, 404, 400)
    lines = _request_lines(logging_server)
    # each protocol's lines in order (gRPC and REST run on their own loops: their lines may interleave)
    lines = [e for e in lines if e["protocol"] == "grpc"] + [e for e in lines if e["protocol"] == "rest"]
    assert [_fields(e) for e in lines] == [
        {"protocol": "grpc", "method": "Predict", "model": MODEL, "version": "2", "signature": "serving_default",
         "status": "OK", "http_status": 200, "batch_rows": 5},
        # [5,4,8,1] contradicts the fixed [?,8,8,1] at its declared rank: refused by the signature check (issue
        # 32), before the version and rows are noted, as every contract refusal is
        {"protocol": "grpc", "method": "Predict", "model": MODEL, "version": "", "signature": "",
         "status": "INVALID_ARGUMENT", "http_status": 400, "batch_rows": None},
        {"protocol": "rest", "method": "predict", "model": MODEL, "version": "2", "signature": "serving_default",
         "status": "OK", "http_status": 200, "batch_rows": 2},
        {"protocol": "rest", "method": "predict", "model": "__unknown__", "version": "", "signature": "",
         "status": "NOT_FOUND", "http_status": 404, "batch_rows": None},
        # a body that is not JSON is refused before a version is held (DataPlane.predict_decoded): no version
        {"protocol": "rest", "method": "predict", "model": MODEL, "version": "", "signature": "",
         "status": "INVALID_ARGUMENT", "http_status": 400, "batch_rows": None},
    ]
    assert all(e["message"] == "request" and e["level"] == "INFO" and e["latency_ms"] > 0 for e in lines)
    assert re.fullmatch(r"ipv[46]:.*:\d+", lines[0]["peer"]) and re.fullmatch(r"127\.0\.0\.1:\d+", lines[2]["peer"])


def test_request_log_is_off_by_default(server, client, images):
    client.predict(MODEL, {"image": images})
    assert requests.get(f"{server.rest_url}/v1/models/{MODEL}", timeout=30).status_code == 200
    assert "tfship.requests" not in server.stderr_tail(400)


def test_sampling_rate_logs_that_fraction():
    rate, seed, calls = 0.25, 7, 2000
    request_log = RequestLog(rate, seed=seed)
    sampled = sum(request_log.start("grpc", "Predict") is not None for _ in range(calls))
    reference = random.Random(seed)
    assert sampled == sum(reference.random() < rate for _ in range(calls)) and 400 < sampled < 600
    assert RequestLog(0.0).start("grpc", "Predict") is None
    with pytest.raises(ValueError, match="1.5 is not in"):
        RequestLog(1.5)


def test_sampling_rate_flag_is_checked(repository, capsys):
    code = cli.main(["serve", "--repository", str(repository), "--model-name", MODEL,
                     "--request-log-sampling-rate", "1.5"])
    assert code == 2 and "--request-log-sampling-rate 1.5" in capsys.readouterr().err


def test_plain_log_line_is_json_after_the_logger_name(repository, images):
    with ServerProcess(repository, MODEL, extra_args=("--request-log-sampling-rate", "1",
                                                      "--file-system-poll-wait-seconds", "0")) as server:
        with PredictClient(server.grpc_target) as client:
            client.predict(MODEL, {"image": np.zeros((3, 8, 8, 1), np.float32)})
        lines = [ln for ln in server.stderr_tail(200).splitlines() if " tfship.requests: " in ln]
        entries = [json.loads(line.split(" tfship.requests: ", 1)[1]) for line in lines]
        assert [e["method"] for e in entries] == ["GetModelMetadata", "Predict"]  # the client reads the contract
        assert (entries[0]["model"], entries[0]["version"], entries[0]["status"]) == (MODEL, "2", "OK")
        assert _fields(entries[1]) == {"protocol": "grpc", "method": "Predict", "model": MODEL, "version": "2",
                                  "signature": "serving_default", "status": "OK", "http_status": 200,
                                  "batch_rows": 3}
