"""Predict's planned path (`serving.tfs.predict_plans`, issue 43) answers as the general path does.

A real `PredictionServicer` over a real `DataPlane` and `ModelManager` (the `identity` backend, two versions). Every
request goes to two servicers of the same data plane: one with its planned path, one with it switched off (the general
path alone). Their answers (wire bytes) and refusals (status and message) must be equal, request after request, and
the planned path must really be taken for a repeated layout (else the comparison would prove nothing).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from bench.serve.identity import register
from tfship.core import protocol
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig, VersionPolicy
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.dataplane.types import ServerLimits
from tfship.serving.operations.metrics import Metrics
from tfship.serving.runtimes import RuntimeOptions
from tfship.serving.tfs.grpc_service import PredictionServicer


class Refused(Exception):
    def __init__(self, code, message):
        super().__init__(code, message)
        self.code, self.message = code, message


class _Context:
    """The `grpc.aio.ServicerContext` methods Predict calls: a deadline 30 s away, the peer, abort."""

    def time_remaining(self) -> float:
        return 30.0

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    async def abort(self, code, message):
        raise Refused(code, message)


def _request(x: np.ndarray | None = None, *, name: str = "x", version: int | None = None, content: bytes | None = None,
             floats: list | None = None, output_filter: tuple = (), dims: tuple | None = None) -> bytes:
    request = protocol.PredictRequest()
    request.model_spec.name = "echo"
    if version is not None:
        request.model_spec.version.value = version
    tensor = request.inputs[name]
    if x is not None:
        tensor.CopyFrom(to_tensor_proto(x))
    else:
        tensor.dtype = 1  # DT_FLOAT
        for size in dims or ():
            tensor.tensor_shape.dim.add(size=size)
    if content is not None:
        tensor.tensor_content = content
    if floats is not None:
        tensor.float_val.extend(floats)
    request.output_filter.extend(output_filter)
    return request.SerializeToString()


def _repository(tmp_path, versions=(1,)):
    register()  # the benchmark's `identity` backend (not in the production registry)
    for version in versions:
        folder = tmp_path / "echo" / str(version)
        folder.mkdir(parents=True)
        (folder / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}}))
    return tmp_path / "echo"


async def _answer(servicer: PredictionServicer, data: bytes):
    """(bytes, None) or (None, (status, message)) of one Predict of serialised `data`."""
    try:
        return await servicer.Predict(protocol.PredictRequest.FromString(data), _Context()), None
    except Refused as refused:
        return None, (refused.code, refused.message)


def _serve(tmp_path, requests: list[bytes], limits: ServerLimits | None = None, sampling_rate: float = 0.0,
           between=None):
    """Each request through the planned and the general servicer in turn: [(planned, general)], the planned path's
    `predict_held` calls, and the data plane's metrics text.
    """
    base = _repository(tmp_path, (1, 2))

    async def run():
        with ThreadPoolExecutor(2) as pool:
            metrics = Metrics()
            manager = ModelManager("identity", RuntimeOptions(), pool, metrics=metrics)
            await manager.apply_config([ModelConfig("echo", base, policy=VersionPolicy("all"))])
            dataplane = DataPlane(manager, pool, limits or ServerLimits(), metrics)
            dataplane.request_log.sampling_rate = sampling_rate
            planned, general = PredictionServicer(dataplane), PredictionServicer(dataplane)

            async def never(request, time_remaining):
                return None

            general._plans.predict = never  # the general path alone
            held = []
            original = dataplane.predict_held

            async def counted(*args, **kwargs):
                held.append(args[1])
                return await original(*args, **kwargs)

            dataplane.predict_held = counted
            pairs = []
            for i, data in enumerate(requests):
                pairs.append((await _answer(planned, data), await _answer(general, data)))
                if between is not None:
                    await between(i, manager, base)
            await manager.unload_all()
            return pairs, held

    return asyncio.run(run())


ROW = np.arange(4, dtype=np.float32).reshape(1, 4)


def test_repeated_layouts_take_the_planned_path_and_answer_the_same_bytes(tmp_path):
    requests = [_request(ROW + i) for i in range(4)] + [_request(np.ones((3, 4), np.float32) * i) for i in range(3)]
    requests += [_request(ROW, version=1), _request(ROW * 2, version=1), _request(ROW, version=2)]
    pairs, held = _serve(tmp_path, requests)
    for planned, general in pairs:
        assert planned[1] is None and planned == general
    # every request of a layout seen before (same spec, rows, dtype): 3 + 2 + 1, and the first of each learns it
    assert len(held) == len(requests)
    answer = protocol.PredictResponse.FromString(pairs[2][0][0])
    np.testing.assert_array_equal(np.frombuffer(answer.outputs["x"].tensor_content, np.float32)
                                  if answer.outputs["x"].tensor_content else answer.outputs["x"].float_val,
                                  (ROW + 2).ravel())
    assert answer.model_spec.version.value == 2  # latest
    assert protocol.PredictResponse.FromString(pairs[7][0][0]).model_spec.version.value == 1


@pytest.mark.parametrize("bad", [
    pytest.param(_request(dims=(1, 4), content=b"\0" * 15), id="content of the wrong length"),
    pytest.param(_request(dims=(1, 4), content=b"\0" * 17), id="content one byte over"),
    pytest.param(_request(dims=(1, 4), floats=[1.0, 2.0, 3.0]), id="typed values of the wrong count"),
])
def test_values_a_plan_cannot_vouch_for_are_refused_as_the_general_path_refuses_them(tmp_path, bad):
    """Sent after good requests of the same declared layout (the plan exists): the values are still judged."""
    pairs, _held = _serve(tmp_path, [_request(ROW), _request(ROW), bad, _request(ROW), bad])
    for planned, general in pairs:
        assert planned == general
    assert pairs[2][0][1] is not None and pairs[2][0][1][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert pairs[4][0] == pairs[2][0]  # and again, with the plan still there
    assert pairs[3][0][1] is None


@pytest.mark.parametrize("bad", [
    pytest.param(_request(ROW.astype(np.float64)), id="dtype"),
    pytest.param(_request(np.zeros((1, 5), np.float32)), id="fixed dim"),
    pytest.param(_request(ROW, name="y"), id="input name"),
    pytest.param(_request(ROW, version=7), id="version not served"),
    pytest.param(_request(np.zeros((0, 4), np.float32)), id="zero rows"),
    pytest.param(_request(np.zeros((9, 4), np.float32)), id="rows over the limit"),
])
def test_a_refused_layout_is_refused_every_time_and_never_planned(tmp_path, bad):
    pairs, held = _serve(tmp_path, [bad, _request(ROW), bad, bad], ServerLimits(max_batch_per_request=8))
    for planned, general in pairs:
        assert planned == general
    for planned, _general in (pairs[0], pairs[2], pairs[3]):
        assert planned[1] is not None and planned[1][0] in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert len(held) == 1  # only the good request


def test_a_new_version_is_judged_again(tmp_path):
    async def retire_latest(i, manager, base):
        if i == 1:  # version 2 goes away: the latest is 1, a runtime the plan was not made on
            await manager.apply_config([ModelConfig("echo", base, policy=VersionPolicy("specific", versions=(1,)))])

    pairs, held = _serve(tmp_path, [_request(ROW)] * 4, between=retire_latest)
    versions = [protocol.PredictResponse.FromString(planned[0]).model_spec.version.value for planned, _ in pairs]
    assert versions == [2, 2, 1, 1]
    for planned, general in pairs:
        assert planned == general


@pytest.mark.parametrize("request_bytes", [
    pytest.param(_request(ROW, output_filter=("x",)), id="output filter"),
])
def test_requests_outside_the_plans_go_the_general_way(tmp_path, request_bytes):
    pairs, held = _serve(tmp_path, [request_bytes] * 3)
    assert held == [] and all(planned == general and planned[1] is None for planned, general in pairs)


def test_request_logging_keeps_every_request_on_the_general_path(tmp_path):
    pairs, held = _serve(tmp_path, [_request(ROW)] * 3, sampling_rate=1.0)
    assert held == [] and all(planned == general for planned, general in pairs)


def test_a_plan_never_keeps_a_retired_version_alive(tmp_path):
    """The planned path refers to its runtime weakly: a version retired while its plan is remembered is not kept."""
    import gc

    from tfship.serving.dataplane.types import ModelRef
    from tfship.serving.tfs.predict_plans import _Plan

    seen = {}

    async def retire_latest(i, manager, base):
        if i == 1:  # version 2 answered twice (its plan is remembered), then it is retired
            served = manager.hold(ModelRef("echo", version=2))
            runtime = served.runtime
            manager.release(served)
            await manager.apply_config([ModelConfig("echo", base, policy=VersionPolicy("specific", versions=(1,)))])
            gc.collect()
            seen["plans holding it"] = [r for r in gc.get_referrers(runtime) if isinstance(r, _Plan)]

    pairs, held = _serve(tmp_path, [_request(ROW)] * 3, between=retire_latest)
    assert seen["plans holding it"] == []
    versions = [protocol.PredictResponse.FromString(planned[0]).model_spec.version.value for planned, _ in pairs]
    assert versions == [2, 2, 1] and len(held) == 3


def test_a_cancelled_predict_is_counted_as_cancelled_on_both_paths(tmp_path):
    """A client that goes away while the model runs: `tfship_requests_total` says CANCELLED, not OK."""
    import threading

    from prometheus_client import generate_latest

    from tfship.serving.runtimes.base import Runtime

    class Slow(Runtime):
        def __init__(self, inner):
            super().__init__(inner.version_dir, inner.options)
            self.inner, self.ready, self.release = inner, inner.ready, threading.Event()

        @classmethod
        def can_serve(cls, version_dir):
            return False

        def load(self):
            self.inner.load()

        def predict_now(self, inputs, signature_name, rows):
            return None  # always on a worker thread, so the event loop can cancel the caller

        def predict(self, inputs, signature_name="serving_default"):
            self.release.wait(5)  # until the test lets it go (the caller was cancelled meanwhile)
            return self.inner.predict(inputs, signature_name)

        def metadata(self):
            return self.inner.metadata()

    base = _repository(tmp_path)
    runtimes = []

    async def run():
        with ThreadPoolExecutor(2) as pool:
            metrics = Metrics()
            manager = ModelManager("identity", RuntimeOptions(), pool, metrics=metrics,
                                   wrap=lambda r: runtimes.append(Slow(r)) or runtimes[-1])
            await manager.apply_config([ModelConfig("echo", base)])
            dataplane = DataPlane(manager, pool, ServerLimits(), metrics)
            planned, general = PredictionServicer(dataplane), PredictionServicer(dataplane)

            async def never(request, time_remaining):
                return None

            general._plans.predict = never
            runtimes[0].release.set()
            await _answer(planned, _request(ROW))  # the layout is learned: the planned path from now on
            runtimes[0].release.clear()
            for servicer in (planned, general, planned):
                call = asyncio.ensure_future(_answer(servicer, _request(ROW)))
                await asyncio.sleep(0.05)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
            runtimes[0].release.set()
            text = generate_latest(metrics.registry).decode()
            await manager.unload_all()
            return [line for line in text.splitlines() if line.startswith("tfship_requests_total")]

    lines = asyncio.run(run())
    assert any('status="CANCELLED"' in line and line.endswith(" 3.0") for line in lines), lines
    assert any('status="OK"' in line and line.endswith(" 1.0") for line in lines), lines
