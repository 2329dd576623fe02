"""Hot swap under load: a real server swaps version N for N+1 eight times while Predict calls keep coming.

Every call is answered (no failure during any swap), every swap completes, and the server's RSS stays
within 10 % (low and high envelope of the first and last swaps, `bench.serve.hotswap.rss_trend`). The twenty-cycle
measurement with a heavier model is `python -m bench.serve.hotswap` (bench/results/hotswap-latest.md).
"""

from __future__ import annotations

import numpy as np
from conftest import MODEL

from bench.serve.hotswap import hot_swap


def test_hot_swap_under_load_keeps_answering_and_rss_flat(repository, tmp_path):
    x = {"image": np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32)}
    result = hot_swap(repository / MODEL / "1", tmp_path, "onnx", cycles=8, inputs=x, load_threads=2, poll_s=0.1)
    assert result["failed"] == {}, result["failed"]
    assert result["answered"] > 0 and len(result["swap_s"]) == 8
    assert abs(result["growth"]) <= 0.10, [round(b / 1e6) for b in result["rss_bytes"]]
