"""Memory one request may cause: bounded before it runs, and not pinned after it was answered (RSS)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import MODEL

from tfship.serving.dataplane.memory import estimate_request_bytes
from tfship.serving.launcher import ServerProcess
from tfship.serving.settings import ServerSettings
from tfship.serving.tfs.client import PredictClient, RemoteError


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_default_row_limit_is_serving_sized():
    assert ServerSettings().max_batch_per_request == 1024
    assert ServerSettings().max_request_memory_bytes == 256 << 20


def test_rss_returns_after_max_size_requests(repository):
    """Four concurrent requests at the default row limit, three times: RSS grows by tens of MB at most (QA saw
    1 GB pinned per 65,536-row request); a request above the limit is refused before it runs."""
    with ServerProcess(repository, MODEL, backend="onnx", extra_args=("--rest-port", "-1")) as server, \
            PredictClient(server.grpc_target) as client:
        client.predict(MODEL, {"image": np.zeros((1, 8, 8, 1), np.float32)})
        before = _rss_mb(server.process.pid)
        big = {"image": np.random.default_rng(0).random((1024, 8, 8, 1), dtype=np.float32)}
        with ThreadPoolExecutor(4) as pool:
            for _ in range(3):
                results = list(pool.map(lambda _: client.predict(MODEL, big)["logits"].shape, range(4)))
                assert results == [(1024, 10)] * 4
        for _ in range(5):
            client.predict(MODEL, {"image": np.zeros((1, 8, 8, 1), np.float32)})
        after = _rss_mb(server.process.pid)
        print(f"RSS before {before:.0f} MB, after 12 x 1024-row requests {after:.0f} MB")
        assert after - before < 100, (before, after)
        with pytest.raises(RemoteError) as err:
            client.predict(MODEL, {"image": np.zeros((1025, 8, 8, 1), np.float32)})
        assert err.value.grpc_code == "INVALID_ARGUMENT" and "per-request limit of 1024" in err.value.details


def test_request_memory_bound_names_the_flag(repository):
    with ServerProcess(repository, MODEL, backend="onnx",
                       extra_args=("--rest-port", "-1", "--max-request-memory-bytes", "100000")) as server, \
            PredictClient(server.grpc_target) as client:
        assert client.predict(MODEL, {"image": np.zeros((8, 8, 8, 1), np.float32)})["logits"].shape == (8, 10)
        with pytest.raises(RemoteError) as err:
            client.predict(MODEL, {"image": np.zeros((512, 8, 8, 1), np.float32)})
        assert err.value.grpc_code == "RESOURCE_EXHAUSTED"
        assert "--max-request-memory-bytes 100000" in err.value.details and "512 rows" in err.value.details


def test_estimate_counts_inputs_and_outputs():
    from tfship.core.contract import Signature, TensorSpec

    signature = Signature("s", {"x": TensorSpec("float32", (None, 4))},
                          {"y": TensorSpec("float32", (None, 10)), "z": TensorSpec("int64", (None,))})
    inputs = {"x": np.zeros((100, 4), np.float32)}
    assert estimate_request_bytes(signature, inputs, 100) == 100 * 4 * 4 + 100 * 10 * 4 + 100 * 8
