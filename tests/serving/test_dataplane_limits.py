"""Data-plane limits in-process: concurrency cap (RESOURCE_EXHAUSTED) and deadlines (DEADLINE_EXCEEDED)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import MODEL
from test_batching import Gated

from tfship.core.errors import DeadlineExceededError, ResourceExhaustedError
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import InferenceRequest, ModelRef, ServerLimits
from tfship.serving.operations.metrics import Metrics
from tfship.serving.runtimes import RuntimeOptions

X = {"image": np.zeros((1, 8, 8, 1), np.float32)}


async def _dataplane(pool, repository, limits: ServerLimits) -> tuple[DataPlane, list[Gated]]:
    gates: list[Gated] = []

    def wrap(runtime):
        gates.append(Gated(runtime))
        return gates[-1]

    manager = ModelManager("onnx", RuntimeOptions(), pool, wrap=wrap)
    await manager.apply_config([ModelConfig(MODEL, repository / MODEL)])
    return DataPlane(manager, pool, limits, Metrics()), gates


def test_concurrency_cap_and_deadlines(repository):
    async def run():
        with ThreadPoolExecutor(4) as pool:
            dp, [gated] = await _dataplane(pool, repository, ServerLimits(max_concurrent_requests=1))
            held = asyncio.create_task(dp.predict(InferenceRequest(ModelRef(MODEL), X)))
            while not gated.entered.is_set():
                await asyncio.sleep(0.01)  # until the first request occupies the only slot
            with pytest.raises(ResourceExhaustedError, match="limit is 1"):
                await dp.predict(InferenceRequest(ModelRef(MODEL), X))
            gated.gate.set()
            assert (await held).outputs["class_id"].shape == (1,)
            with pytest.raises(DeadlineExceededError, match="before the request reached the model"):
                await dp.predict(InferenceRequest(ModelRef(MODEL), X, deadline=time.monotonic() - 1))
            gated.gate.clear()
            with pytest.raises(DeadlineExceededError, match="while the model was running"):
                await dp.predict(InferenceRequest(ModelRef(MODEL), X, deadline=time.monotonic() + 0.2))
            gated.gate.set()
            return await dp.predict(InferenceRequest(ModelRef(MODEL), X))

    assert asyncio.run(run()).version == 2
