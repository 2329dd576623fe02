"""A loaded version's objects are frozen out of the garbage collector, and an unloaded version's cycles are still
collected (`serving.dataplane.memory.freeze_loaded_heap` / `collect_unloaded`, called by the model manager).

A real `ModelManager` over the `identity` backend; the runtime it loads is composed with one that holds a reference
cycle, as TensorFlow's loaded objects do, so only the cyclic collector can free it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from concurrent.futures import ThreadPoolExecutor

from bench.serve.identity import register
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig, VersionPolicy
from tfship.serving.runtimes import RuntimeOptions
from tfship.serving.runtimes.base import Runtime


class _Cycle:
    """An object in a reference cycle with itself: refcounting never frees it."""

    def __init__(self) -> None:
        self.me = self


class Cyclic(Runtime):
    """A runtime composed around another that holds a reference cycle."""

    def __init__(self, inner: Runtime) -> None:
        super().__init__(inner.version_dir, inner.options)
        self.inner, self.ready, self.cycle = inner, inner.ready, _Cycle()

    @classmethod
    def can_serve(cls, version_dir):
        return False

    def load(self):
        self.inner.load()

    def predict(self, inputs, signature_name="serving_default"):
        return self.inner.predict(inputs, signature_name)

    def metadata(self):
        return self.inner.metadata()


def test_a_loaded_version_is_frozen_and_an_unloaded_ones_cycles_are_collected(tmp_path):
    register()
    for version in (1, 2):
        folder = tmp_path / "echo" / str(version)
        folder.mkdir(parents=True)
        (folder / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}}))
    loaded: list[Cyclic] = []
    seen = {}

    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = ModelManager("identity", RuntimeOptions(), pool, wrap=lambda r: loaded.append(Cyclic(r)) or
                                   loaded[-1])
            gc.unfreeze()
            await manager.apply_config([ModelConfig("echo", tmp_path / "echo", policy=VersionPolicy("specific",
                                                                                                    versions=(1,)))])
            seen["frozen after the load"] = gc.get_freeze_count()
            seen["cycle"] = weakref.ref(loaded[0].cycle)
            loaded.clear()  # only the manager holds version 1 now
            await manager.apply_config([ModelConfig("echo", tmp_path / "echo", policy=VersionPolicy("specific",
                                                                                                    versions=(2,)))])
            seen["frozen after the swap"] = gc.get_freeze_count()
            await manager.unload_all()

    try:
        asyncio.run(run())
    finally:
        gc.unfreeze()  # the rest of the test process collects as before
    assert seen["frozen after the load"] > 0
    assert seen["cycle"]() is None  # version 1's cycle was frozen, and is gone once it was unloaded
    assert seen["frozen after the swap"] > 0
