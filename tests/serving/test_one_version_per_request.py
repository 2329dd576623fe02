"""A predict looks its version up once and runs on the version it was decoded against, even mid-swap.

Real parts: the `identity` backend behind a real `ModelManager` and `DataPlane`, with the TF Serving REST
app and the Open Inference gRPC service on loopback ports. Version 1 takes input `x`, version 2 takes input
`y`, so a body decoded for one version fails on the other. The swap happens where a handler yields between
its lookup and its run: while a large body is decoded in the helper process (`Offloader.run_if_large`). Here
that step first waits (bounded) for a `reconcile()` that loads version 2 and retires version 1, then decodes
inline. A spy on `ModelManager.resolve` counts the lookups and asks the real manager.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from bench.serve.identity import register
from tfship.core import kserve_protocol as kp
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.offload import OFF_LOOP_BYTES, Offloader
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ModelRef, ServerLimits, VersionState
from tfship.serving.kserve.grpc_service import add_inference_service
from tfship.serving.operations.metrics import Metrics
from tfship.serving.rest_port import build_app
from tfship.serving.runtimes import RuntimeOptions

SWAP_WAIT_S = 1.0  # how long the decode step lets the swap run (it cannot finish while the request holds v1)
ROW = [0.5, 1.0, 1.5, 2.0]
LARGE_ROWS = OFF_LOOP_BYTES // 16 + 1  # float32 [rows, 4] above OFF_LOOP_BYTES: decoded "in the helper process"
SWAPPING = {"decode_predict", "decode_infer_inputs"}  # the decoders that run after the lookup


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
        if self.swap is None and function.__name__ in SWAPPING:
            _publish(self.root, 2, "y")
            self.swap = asyncio.ensure_future(self.manager.reconcile())
            try:
                await asyncio.wait_for(asyncio.shield(self.swap), SWAP_WAIT_S)
            except TimeoutError:
                pass  # version 1 is held by the request being decoded: the swap waits for it
            self.states_seen = {s.version: s.state for s in self.manager.statuses(ModelRef("echo"))}
        return function(*args)


async def _serve(root: Path, ask) -> tuple:
    """Serve `echo` version 1, `await ask(dataplane, offloader)` twice (before and after the swap completes);
    returns (first answer, lookups, states seen mid-swap), (second answer, lookups).
    """
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
        dataplane.offloader = offloader = SwapWhileDecoding(manager, root)
        during = (await ask(dataplane, "x"), len(lookups), offloader.states_seen)
        if offloader.swap is not None:
            await asyncio.wait_for(offloader.swap, 30)  # released: version 1 retires, the swap completes
        else:
            _publish(root, 2, "y")
            await manager.reconcile()
        after = (await ask(dataplane, "y"), len(lookups))
        await manager.unload_all()
    return during, after


def _rest(path: str, body):
    async def ask(dataplane: DataPlane, alias: str):
        async with TestClient(TestServer(build_app(dataplane), host="127.0.0.1")) as http:
            response = await http.post(path, json=body(alias))
            return response.status, await response.json()

    return ask


async def _grpc_infer(dataplane: DataPlane, alias: str):
    server = grpc.aio.server()
    add_inference_service(server, dataplane)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        request = kp.ModelInferRequest(model_name="echo")
        tensor = request.inputs.add(name=alias, datatype="FP32", shape=[LARGE_ROWS, 4])
        tensor.contents.fp32_contents.extend(np.tile(np.float32(ROW), LARGE_ROWS).tolist())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
            call = channel.unary_unary(f"/{kp.SERVICE}/ModelInfer",
                                       request_serializer=kp.ModelInferRequest.SerializeToString,
                                       response_deserializer=kp.ModelInferResponse.FromString)
            try:
                response = await call(request, timeout=30)
            except grpc.aio.AioRpcError as err:
                return err.code().name, err.details()
        (output,) = response.outputs
        values = np.array(output.contents.fp32_contents or np.frombuffer(response.raw_output_contents[0], np.float32))
        return "OK", response.model_version, output.name, bool(np.all(values.reshape(-1, 4) == np.float32(ROW)))
    finally:
        await server.stop(None)


def test_tf_serving_rest_predict_mid_swap_runs_on_the_version_it_decoded_against(tmp_path):
    ask = _rest("/v1/models/echo:predict", lambda alias: {"inputs": {alias: [ROW] * LARGE_ROWS}})
    during, after = asyncio.run(_serve(tmp_path, ask))
    (status, answer), lookups, states = during
    assert status == 200 and answer == {"outputs": [ROW] * LARGE_ROWS}, str(answer)[:300]  # only v1 takes `x`
    assert states == {1: VersionState.UNLOADING, 2: VersionState.AVAILABLE}  # the swap was under way
    assert lookups == 1
    (status, answer), lookups = after
    assert (status, lookups) == (200, 2) and answer == {"outputs": [ROW] * LARGE_ROWS}  # v2 takes `y`


def test_open_inference_grpc_infer_mid_swap_answers_the_held_version(tmp_path):
    during, after = asyncio.run(_serve(tmp_path, _grpc_infer))
    answer, lookups, states = during
    assert answer == ("OK", "1", "x", True), answer
    assert states == {1: VersionState.UNLOADING, 2: VersionState.AVAILABLE}
    assert lookups == 1
    answer, lookups = after
    assert answer == ("OK", "2", "y", True) and lookups == 2, answer


def test_open_inference_rest_infer_looks_its_version_up_once(tmp_path):
    ask = _rest("/v2/models/echo/infer",
                lambda alias: {"inputs": [{"name": alias, "shape": [1, 4], "datatype": "FP32", "data": ROW}]})
    during, after = asyncio.run(_serve(tmp_path, ask))
    (status, answer), lookups, _ = during
    assert status == 200 and answer["model_version"] == "1" and answer["outputs"][0]["data"] == ROW, answer
    assert lookups == 1
    (status, answer), lookups = after
    assert status == 200 and answer["model_version"] == "2" and lookups == 2, answer
