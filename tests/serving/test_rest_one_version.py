"""A REST predict looks its version up once and runs on the version it was decoded against, even mid-swap.

Real parts: the `identity` backend behind a real `ModelManager`, `DataPlane` and the REST app on a loopback
port. Version 1 takes input `x`, version 2 takes input `y`, so a body decoded for one version fails on the
other. The swap happens where the REST handler yields between its lookup and its run: while a large body
is decoded in the helper process (`Offloader.run_if_large`). Here that step first waits (bounded) for a
`reconcile()` that loads version 2 and retires version 1, then decodes inline. The Open Inference REST
handler has no such yield; its test counts the lookups.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from bench.serve.identity import register
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.offload import Offloader
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ModelRef, ServerLimits, VersionState
from tfship.serving.operations.metrics import Metrics
from tfship.serving.runtimes import RuntimeOptions
from tfship.serving.tfs.rest import build_app

SWAP_WAIT_S = 1.0  # how long the decode step lets the swap run (it cannot finish while the request holds v1)
ROW = [0.5, 1.0, 1.5, 2.0]


def _publish(root: Path, version: int, alias: str) -> None:
    folder = root / "echo" / str(version)
    folder.mkdir(parents=True)
    (folder / "identity.json").write_text(json.dumps({"inputs": {alias: {"dtype": "float32", "shape": [None, 4]}}}))


class SwapWhileDecoding(Offloader):
    """Decodes inline, but first publishes version 2 and lets `reconcile()` swap to it for up to `SWAP_WAIT_S`."""

    def __init__(self, manager: ModelManager, root: Path) -> None:
        super().__init__()
        self.manager, self.root = manager, root
        self.swap: asyncio.Task | None = None
        self.states_seen: dict[int, VersionState] = {}

    async def run_if_large(self, size: int, function, *args):
        if self.swap is None and function.__name__ == "decode_predict":  # TF Serving REST: decoded once held
            _publish(self.root, 2, "y")
            self.swap = asyncio.ensure_future(self.manager.reconcile())
            try:
                await asyncio.wait_for(asyncio.shield(self.swap), SWAP_WAIT_S)
            except TimeoutError:
                pass  # version 1 is held by the request being decoded: the swap waits for it
            self.states_seen = {s.version: s.state for s in self.manager.statuses(ModelRef("echo"))}
        return function(*args)


async def _serve_and_ask(root: Path, path: str, body: dict, follow_up: dict) -> tuple:
    register()  # the benchmark's `identity` backend (not in the production registry)
    _publish(root, 1, "x")
    with ThreadPoolExecutor(2) as pool:
        manager = ModelManager("identity", RuntimeOptions(), pool)
        await manager.apply_config([ModelConfig("echo", root / "echo")])
        lookups = []
        real_resolve = manager.resolve

        def counting_resolve(ref):
            lookups.append(ref)
            return real_resolve(ref)

        manager.resolve = counting_resolve  # a spy that counts, then asks the real manager
        dataplane = DataPlane(manager, pool, ServerLimits(), Metrics())
        offloader = SwapWhileDecoding(manager, root)
        async with TestClient(TestServer(build_app(dataplane, offloader=offloader), host="127.0.0.1")) as http:
            response = await http.post(path, json=body)
            during = (response.status, await response.json(), len(lookups), offloader.states_seen)
            if offloader.swap is not None:
                await asyncio.wait_for(offloader.swap, 30)  # released: version 1 retires, the swap completes
            else:
                _publish(root, 2, "y")
                await manager.reconcile()
            response = await http.post(path, json=follow_up)
            after = (response.status, await response.json(), len(lookups))
        await manager.unload_all()
    return during, after


def test_tf_serving_rest_predict_mid_swap_runs_on_the_version_it_decoded_against(tmp_path):
    during, after = asyncio.run(_serve_and_ask(tmp_path, "/v1/models/echo:predict", {"inputs": {"x": [ROW]}},
                                               {"inputs": {"y": [ROW]}}))
    status, answer, lookups, states = during
    assert (status, answer) == (200, {"outputs": [ROW]}), answer  # only version 1 takes `x`
    assert states == {1: VersionState.UNLOADING, 2: VersionState.AVAILABLE}  # the swap was under way
    assert lookups == 1
    status, answer, lookups = after
    assert (status, answer, lookups) == (200, {"outputs": [ROW]}, 2)  # version 2 (input `y`), one more lookup


def test_open_inference_rest_infer_looks_its_version_up_once(tmp_path):
    def infer(name: str) -> dict:
        return {"inputs": [{"name": name, "shape": [1, 4], "datatype": "FP32", "data": ROW}]}

    during, after = asyncio.run(_serve_and_ask(tmp_path, "/v2/models/echo/infer", infer("x"), infer("y")))
    status, answer, lookups, _ = during
    assert status == 200 and answer["model_version"] == "1" and answer["outputs"][0]["data"] == ROW, answer
    assert lookups == 1
    status, answer, lookups = after
    assert status == 200 and answer["model_version"] == "2" and lookups == 2, answer
