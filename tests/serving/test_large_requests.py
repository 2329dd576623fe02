"""A large request is decoded in the helper process: small requests keep flowing meanwhile (QA: a 1-row
request waited 9.2 s behind a 60 MB body decoded on the event loop)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import numpy as np
import pytest
from conftest import MODEL

from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient


@pytest.mark.slow  # a 10 MB JSON body decoded end to end
def test_small_requests_flow_while_a_large_rest_body_decodes(repository):
    with ServerProcess(repository, MODEL, backend="onnx",
                       extra_args=("--max-batch-per-request", "0", "--max-request-memory-bytes", "0")) as server, \
            PredictClient(server.grpc_target) as client:
        rows = 12000
        body = json.dumps({"instances": np.random.default_rng(0).random((rows, 8, 8, 1)).round(4).tolist()}).encode()
        answer: dict = {}

        def big() -> None:
            request = urllib.request.Request(f"{server.rest_url}/v1/models/{MODEL}:predict", data=body)
            with urllib.request.urlopen(request, timeout=120) as response:
                answer["rows"] = len(json.loads(response.read())["predictions"])

        thread = threading.Thread(target=big)
        thread.start()
        worst, small = 0.0, 0
        while thread.is_alive():
            started = time.monotonic()
            assert client.predict(MODEL, {"image": np.zeros((1, 8, 8, 1), np.float32)})["logits"].shape == (1, 10)
            worst, small = max(worst, time.monotonic() - started), small + 1
        thread.join()
    assert answer["rows"] == rows and small > 5
    assert worst < 1.0, f"a 1-row request waited {worst:.2f}s behind a {len(body) >> 20} MiB body"
