"""Requests are judged on what they declare before their values are decoded, and a refused one is freed at once.

Real parts: the `identity` backend behind a real `ModelManager` and `DataPlane` (limits: 100 rows, 2 MiB per
request), TF Serving's gRPC Predict, the Open Inference gRPC service and both REST APIs on loopback. The
offloader is the real one; a subclass only records which decoders were handed to it.
Issue 21: a 64 MB Predict of 2,000,000 rows was copied to the helper and decoded before its row count was
refused, and four at once held 3 GB, which stayed until the garbage collector ran.
"""

from __future__ import annotations

import asyncio
import gc
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.serve.identity import register
from tfship.core import kserve_protocol as kp
from tfship.core import protocol
from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError
from tfship.serving.dataplane.admission import check_declared
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.offload import OFF_LOOP_BYTES, Offloader
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ServerLimits
from tfship.serving.grpc_calls import LargeRequest
from tfship.serving.kserve.grpc_service import add_inference_service
from tfship.serving.operations.metrics import Metrics
from tfship.serving.rest_port import build_app
from tfship.serving.runtimes import RuntimeOptions
from tfship.serving.tfs.grpc_service import add_services

MAX_ROWS, MEMORY_CAP = 100, 2 << 20
LARGE_ROWS = OFF_LOOP_BYTES // 16 + 1  # float32 [rows, 4]: above OFF_LOOP_BYTES on the wire
ROWS_MESSAGE = f"batch of {LARGE_ROWS} rows exceeds the per-request limit of {MAX_ROWS}"


class RecordingOffloader(Offloader):
    """The real offloader, recording the name of every function handed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.functions: list[str] = []
        self.offloaded: list[str] = []  # those given a size above OFF_LOOP_BYTES: run in a helper process

    async def run_if_large(self, size: int, function, *args):
        self.functions.append(function.__name__)
        if size > OFF_LOOP_BYTES:
            self.offloaded.append(function.__name__)
        return await super().run_if_large(size, function, *args)


async def _with_dataplane(root: Path, limits: ServerLimits, ask, offloaded: bool = False):
    """(what `ask(dataplane)` returns, the functions handed to the offloader, or with `offloaded` those it ran
    in a helper process)."""
    register()
    folder = root / "echo" / "1"
    folder.mkdir(parents=True)
    (folder / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}}))
    with ThreadPoolExecutor(2) as pool:
        manager = ModelManager("identity", RuntimeOptions(), pool)
        await manager.apply_config([ModelConfig("echo", root / "echo")])
        dataplane = DataPlane(manager, pool, limits, Metrics())
        dataplane.offloader = offloader = RecordingOffloader()
        try:
            return await ask(dataplane), offloader.offloaded if offloaded else offloader.functions
        finally:
            offloader.close()
            await manager.unload_all()


def _predict(rows: int) -> protocol.PredictRequest:
    request = protocol.PredictRequest()
    request.model_spec.name = "echo"
    tensor = request.inputs["x"]
    tensor.dtype = protocol.DATA_TYPE.values_by_name["DT_FLOAT"].number
    for size in (rows, 4):
        tensor.tensor_shape.dim.add().size = size
    tensor.float_val.extend(np.full(rows * 4, 0.5, np.float32).tolist())  # typed values: the offloaded kind
    return request


def _infer(rows: int) -> kp.ModelInferRequest:
    request = kp.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[rows, 4]).contents.fp32_contents.extend([0.5] * (rows * 4))
    return request


def _grpc(method: str, request, response_cls):
    async def ask(dataplane: DataPlane):
        server = grpc.aio.server()
        add_services(server, dataplane)
        add_inference_service(server, dataplane)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(method, request_serializer=type(request).SerializeToString,
                                           response_deserializer=response_cls.FromString)
                try:
                    await call(request, timeout=60)
                    return "OK", "", await _large_requests_alive()
                except grpc.aio.AioRpcError as err:
                    return err.code().name, err.details(), await _large_requests_alive()
        finally:
            await server.stop(None)

    return ask


async def _large_requests_alive(settle_s: float = 2.0) -> int:
    """`LargeRequest`s still alive while the server runs (held by a reference cycle when `gc` is off), once the
    server's handler has unwound: the client may read the status before it has, so this waits up to `settle_s`.
    """
    deadline = asyncio.get_running_loop().time() + settle_s
    while (alive := sum(type(o) is LargeRequest for o in gc.get_objects())) and \
            asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return alive


PREDICT = protocol.method_path(protocol.PREDICTION_SERVICE, "Predict")
INFER = f"/{kp.SERVICE}/ModelInfer"


@pytest.mark.parametrize("method,request_of,response_cls", [
    (PREDICT, _predict, protocol.PredictResponse), (INFER, _infer, kp.ModelInferResponse)])
def test_grpc_batch_above_the_limit_is_refused_before_decoding(tmp_path, method, request_of, response_cls):
    limits = ServerLimits(max_batch_per_request=MAX_ROWS)
    (code, details, _), handed = asyncio.run(_with_dataplane(tmp_path, limits, _grpc(method, request_of(LARGE_ROWS),
                                                                                 response_cls)))
    assert (code, details) == ("INVALID_ARGUMENT", ROWS_MESSAGE)
    assert handed == []  # nothing was copied to a helper process or decoded


@pytest.mark.parametrize("method,request_of,response_cls", [
    (PREDICT, _predict, protocol.PredictResponse), (INFER, _infer, kp.ModelInferResponse)])
def test_grpc_declared_memory_above_the_cap_is_refused_before_decoding(tmp_path, method, request_of, response_cls):
    limits = ServerLimits(max_request_memory_bytes=MEMORY_CAP)
    (code, details, _), handed = asyncio.run(_with_dataplane(tmp_path, limits, _grpc(method, request_of(LARGE_ROWS),
                                                                                 response_cls)))
    held = 2 * LARGE_ROWS * 4 * 4  # float32 [rows, 4] in, the same out
    assert code == "RESOURCE_EXHAUSTED", details
    assert details == (f"request needs at least {held} bytes for its inputs and outputs ({LARGE_ROWS} rows), "
                       f"above --max-request-memory-bytes {MEMORY_CAP}; send fewer rows")
    assert handed == []


def test_a_request_within_the_limits_is_still_decoded_in_the_helper(tmp_path):
    limits = ServerLimits(max_batch_per_request=LARGE_ROWS)
    (code, details, _), handed = asyncio.run(_with_dataplane(tmp_path, limits, _grpc(PREDICT, _predict(LARGE_ROWS),
                                                                                 protocol.PredictResponse)))
    assert (code, details) == ("OK", "")
    assert "decode_predict" in handed


def test_a_refused_large_grpc_request_is_freed_without_the_garbage_collector(tmp_path):
    """An abort raised inside `except` kept the request in a reference cycle (freed only by `gc.collect`)."""
    limits = ServerLimits(max_batch_per_request=MAX_ROWS)
    gc.collect()
    gc.disable()
    try:
        (code, _, alive), _ = asyncio.run(_with_dataplane(tmp_path, limits, _grpc(PREDICT, _predict(LARGE_ROWS),
                                                                                 protocol.PredictResponse)))
    finally:
        gc.enable()
    assert code == "INVALID_ARGUMENT"
    assert alive == 0


def _rest(path: str, body: dict):
    async def ask(dataplane: DataPlane):
        async with TestClient(TestServer(build_app(dataplane), host="127.0.0.1")) as http:
            response = await http.post(path, data=json.dumps(body))
            return response.status, (await response.json())

    return ask


@pytest.mark.parametrize("rows", [LARGE_ROWS, MAX_ROWS + 1])  # decoded in the helper / inline
@pytest.mark.parametrize("layout", ["instances", "inputs"])
def test_tf_serving_rest_batch_above_the_limit_names_it(tmp_path, rows, layout):
    values = [[0.5] * 4] * rows
    body = {"instances": values} if layout == "instances" else {"inputs": {"x": values}}
    limits = ServerLimits(max_batch_per_request=MAX_ROWS)
    (status, answer), _ = asyncio.run(_with_dataplane(tmp_path, limits, _rest("/v1/models/echo:predict", body)))
    assert status == 400
    assert answer == {"error": f"batch of {rows} rows exceeds the per-request limit of {MAX_ROWS}"}


def test_open_inference_rest_is_judged_on_its_declared_shape_before_its_data(tmp_path):
    """The declared [rows, 4] is refused for its rows although its data holds one row: nothing was converted."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [LARGE_ROWS, 4], "data": [0.5] * 4}]}
    limits = ServerLimits(max_batch_per_request=MAX_ROWS)
    (status, answer), _ = asyncio.run(_with_dataplane(tmp_path, limits, _rest("/v2/models/echo/infer", body)))
    assert (status, answer) == (400, {"error": ROWS_MESSAGE})


def _signature(shape) -> Signature:
    spec = TensorSpec(dtype="float32", shape=shape)
    return Signature(name="serving_default", inputs={"x": spec}, outputs={"y": spec})


def test_only_a_batched_dimension_counts_as_rows():
    check_declared(_signature((3000,)), {"x": [3000]}, MAX_ROWS, 0)  # a fixed dim 0 is not a batch
    check_declared(_signature((None, 4)), {"other": [3000, 4]}, MAX_ROWS, 0)  # not an input of the signature
    check_declared(None, {"x": [3000, 4]}, MAX_ROWS, 0)  # unknown signature: its own error comes later
    with pytest.raises(InvalidRequestError, match="batch of 3000 rows"):
        check_declared(_signature((None, 4)), {"x": [3000, 4]}, MAX_ROWS, 0)


def test_declared_memory_counts_inputs_and_outputs_for_the_declared_rows():
    check_declared(_signature((None, 4)), {"x": [1000, 4]}, 0, 32_000)  # 16,000 in + 16,000 out
    with pytest.raises(ResourceExhaustedError, match="needs at least 32000 bytes"):
        check_declared(_signature((None, 4)), {"x": [1000, 4]}, 0, 31_999)


def _broadcast_predict(shapes: dict[str, list[int]]) -> protocol.PredictRequest:
    """A small Predict whose inputs hold one `float_val` each, which TF Serving fills into the whole shape."""
    request = protocol.PredictRequest()
    request.model_spec.name = "echo"
    for name, shape in shapes.items():
        tensor = request.inputs[name]
        tensor.dtype = protocol.DATA_TYPE.values_by_name["DT_FLOAT"].number
        for size in shape:
            tensor.tensor_shape.dim.add().size = size
        tensor.float_val.append(0.5)
    return request


def test_a_small_predict_is_judged_on_its_declared_rows_before_its_values_are_filled(tmp_path):
    """Issue 21: a 49-byte Predict declaring 262,143 rows was filled to 64 MiB on the main loop, then refused."""
    request = _broadcast_predict({"x": [LARGE_ROWS, 4]})  # one value: fills the whole shape once decoded
    assert request.ByteSize() < OFF_LOOP_BYTES
    limits = ServerLimits(max_batch_per_request=MAX_ROWS)
    (code, details, _), _ = asyncio.run(_with_dataplane(tmp_path, limits, _grpc(PREDICT, request,
                                                                               protocol.PredictResponse)))
    assert (code, details) == ("INVALID_ARGUMENT", ROWS_MESSAGE)


def test_all_inputs_declared_are_bounded_together_before_any_is_filled(tmp_path):
    """Issue 21: 20 unexpected inputs of one `float_val` each, declaring 64 MiB apiece, made a 559-byte request
    allocate 1.3 GB before their names were refused. Their names are refused first now, as TF Serving refuses them
    (VerifyRequestInputsSize before TensorFromProto), so nothing is filled; where no signature judges the names
    (one the model does not have), their declared total is still bounded before any is filled."""
    each = MEMORY_CAP // 4 // 4  # float32 values, a quarter of the cap per input
    request = _broadcast_predict({"x": [1, 4], **{f"extra{i}": [each] for i in range(8)}})
    limits = ServerLimits(max_request_memory_bytes=MEMORY_CAP)
    (code, details, _), _ = asyncio.run(_with_dataplane(tmp_path, limits, _grpc(PREDICT, request,
                                                                               protocol.PredictResponse)))
    assert code == "INVALID_ARGUMENT", details
    assert "unexpected input(s) ['extra0', 'extra1', 'extra2'" in details, details
    request.model_spec.signature_name = "not_a_signature"
    (tmp_path / "unknown").mkdir()
    (code, details, _), _ = asyncio.run(_with_dataplane(tmp_path / "unknown", limits, _grpc(PREDICT, request,
                                                                               protocol.PredictResponse)))
    assert code == "RESOURCE_EXHAUSTED", details
    assert details == (f"the request's 9 input(s) declare {16 + 8 * each * 4} bytes in all (their tensor_shape), "
                       f"above --max-request-memory-bytes {MEMORY_CAP}; send fewer rows or fewer inputs")


def test_a_small_predict_within_the_limits_is_answered_alike(tmp_path):
    request = _broadcast_predict({"x": [3, 4]})  # one value filled into [3, 4], as TF Serving does
    limits = ServerLimits(max_batch_per_request=MAX_ROWS, max_request_memory_bytes=MEMORY_CAP)
    (code, details, _), handed = asyncio.run(_with_dataplane(tmp_path, limits, _grpc(PREDICT, request,
                                                                                   protocol.PredictResponse)))
    assert (code, details, handed) == ("OK", "", [])


def test_open_inference_grpc_raw_bytes_are_split_in_the_helper(tmp_path):
    """Issue 21: 8 million empty BYTES elements in a 32 MB ModelInfer were split in a Python loop on the gRPC
    loop (a 1-row Predict beside it waited 4.9 s), then refused for their datatype."""
    elements = OFF_LOOP_BYTES // 4 + 1
    request = kp.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="BYTES", shape=[elements, 1])
    request.raw_input_contents.append(b"\0\0\0\0" * elements)
    limits = ServerLimits(max_batch_per_request=elements)
    (code, details, _), offloaded = asyncio.run(_with_dataplane(
        tmp_path, limits, _grpc(INFER, request, kp.ModelInferResponse), offloaded=True))
    assert code == "INVALID_ARGUMENT" and "datatype BYTES" in details, details
    assert offloaded == ["decode_infer_inputs"]


def _binary_infer(rows: int) -> tuple[bytes, dict]:
    values = np.full((rows, 4), 0.5, np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                                     "parameters": {"binary_data_size": len(values)}}],
                         "outputs": [{"name": "x", "parameters": {"binary_data": True}}]}).encode()
    return header + values, {"Inference-Header-Content-Length": str(len(header)),
                             "Content-Type": "application/octet-stream"}


def test_open_inference_rest_binary_numbers_are_not_shipped_to_a_helper(tmp_path):
    """Issue 21: a large body of a small JSON header and binary numbers went to the helpers' large lane by its total
    size, where another client's 60 MB JSON bodies had it refused RESOURCE_EXHAUSTED; its values are views."""
    body, headers = _binary_infer(LARGE_ROWS)

    async def ask(dataplane: DataPlane):
        async with TestClient(TestServer(build_app(dataplane), host="127.0.0.1")) as http:
            response = await http.post("/v2/models/echo/infer", data=body, headers=headers)
            answer = await response.read()
            length = int(response.headers["Inference-Header-Content-Length"])
            return response.status, json.loads(answer[:length]), answer[length:]

    limits = ServerLimits(max_batch_per_request=LARGE_ROWS)
    (status, header, values), offloaded = asyncio.run(_with_dataplane(tmp_path, limits, ask, offloaded=True))
    assert status == 200, header
    assert header["outputs"][0]["shape"] == [LARGE_ROWS, 4]
    assert np.array_equal(np.frombuffer(values, np.float32), np.full(LARGE_ROWS * 4, 0.5, np.float32))
    assert offloaded == []


def test_typed_values_that_fit_no_shape_are_refused_before_any_is_converted(tmp_path):
    """A large Predict declaring [10, 4] but carrying 300,000 values (a 60 MB one took 4.9 s to be refused)."""
    request = _predict(10)
    request.inputs["x"].float_val.extend([0.5] * 300_000)  # 300,040 values for 40 elements
    (code, details, _), handed = asyncio.run(_with_dataplane(tmp_path, ServerLimits(), _grpc(
        PREDICT, request, protocol.PredictResponse)))
    assert (code, details) == ("INVALID_ARGUMENT", "input 'x': shape [10, 4] needs 40 values, got 300040")
    assert handed == []  # refused from the counts alone, on the main loop, before the helper
