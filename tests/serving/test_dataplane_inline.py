"""Unbatched model calls: measured-cheap ones run on the event loop, slow ones stay on worker threads.

Real runtimes (the `identity` backend) behind a real `ModelManager` and `DataPlane`; a composed runtime
records the thread each call ran on (and can add a fixed cost), so the test sees where the data plane
put every call and that answers are unchanged.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.serve.identity import register
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import InferenceRequest, ModelRef, ServerLimits
from tfship.serving.operations.metrics import Metrics
from tfship.serving.runtimes import RuntimeOptions
from tfship.serving.runtimes.base import INLINE_CALL_BUDGET_S, Runtime


class Recorded(Runtime):
    """A runtime composed around another: records the calling thread, then sleeps `cost_s` seconds."""

    def __init__(self, inner: Runtime, cost_s: float) -> None:
        super().__init__(inner.version_dir, inner.options)
        self.inner, self.cost_s, self.threads = inner, cost_s, []
        self.ready = inner.ready

    @classmethod
    def can_serve(cls, version_dir):
        return False

    def load(self):
        self.inner.load()
        self.ready = True

    def predict(self, inputs, signature_name="serving_default"):
        self.threads.append(threading.get_ident())
        if self.cost_s:
            time.sleep(self.cost_s)
        return self.inner.predict(inputs, signature_name)

    def metadata(self):
        return self.inner.metadata()

    def unload(self):
        self.inner.unload()


def _calls(tmp_path, cost_s: float, count: int) -> tuple[Recorded, int, list]:
    register()  # the benchmark's `identity` backend (not in the production registry)
    (tmp_path / "echo" / "1").mkdir(parents=True)
    (tmp_path / "echo" / "1" / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32",
                                                                                       "shape": [None, 4]}}}))
    runtimes: list[Recorded] = []

    def wrap(runtime):
        runtimes.append(Recorded(runtime, cost_s))
        return runtimes[-1]

    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = ModelManager("identity", RuntimeOptions(), pool, wrap=wrap)
            await manager.apply_config([ModelConfig("echo", tmp_path / "echo")])
            dataplane = DataPlane(manager, pool, ServerLimits(), Metrics())
            x = np.arange(4, dtype=np.float32).reshape(1, 4)
            answers = [await dataplane.predict(InferenceRequest(ModelRef("echo"), {"x": x + i}, deadline=time.monotonic()
                                                                + 30)) for i in range(count)]
            await manager.unload_all()
            return threading.get_ident(), answers

    loop_thread, answers = asyncio.run(run())
    return runtimes[0], loop_thread, answers


def test_cheap_calls_move_onto_the_event_loop(tmp_path):
    runtime, loop_thread, answers = _calls(tmp_path, 0.0, 20)
    assert runtime.threads[0] != loop_thread  # no estimate yet: the first call goes to a worker thread
    assert runtime.threads[-1] == loop_thread  # measured far below the budget: run where the request is
    for i, answer in enumerate(answers):
        np.testing.assert_array_equal(answer.outputs["x"], np.arange(4, dtype=np.float32).reshape(1, 4) + i)


def test_slow_calls_stay_on_worker_threads(tmp_path):
    runtime, loop_thread, answers = _calls(tmp_path, 20 * INLINE_CALL_BUDGET_S, 6)
    assert loop_thread not in runtime.threads
    assert len(answers) == 6
