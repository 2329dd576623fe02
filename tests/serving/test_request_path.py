"""The per-request path's shortcuts (issue 14) give the answers of the long way.

`RequestChecks` remembers a request layout that passed `validate_inputs`; `RequestStats` keeps the two
per-request metrics as plain numbers. Each is checked against what it replaces: the full validation
(same errors, every time) and prometheus_client's own Counter and Histogram (same exposition).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tfship.core import protocol
from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.contract import RequestChecks, batch_size, validate_inputs
from tfship.serving.dataplane.memory import estimate_request_bytes
from tfship.serving.dataplane.offload import OFF_LOOP_BYTES
from tfship.serving.dataplane.tensors import from_tensor_proto, to_tensor_proto
from tfship.serving.launcher import ServerProcess
from tfship.serving.operations.metrics import LATENCY_BUCKETS_S, RequestStats
from tfship.serving.runtimes.base import Rows

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def _signature(width: int = 4, name: str = "serving_default") -> Signature:
    return Signature(name, {"x": TensorSpec("float32", (None, width)), "k": TensorSpec("int64", (None,))},
                     {"y": TensorSpec("float32", (None, 2))})


def _inputs(rows: int, width: int = 4, dtype=np.float32) -> dict:
    return {"x": np.zeros((rows, width), dtype), "k": np.zeros((rows,), np.int64)}


def test_remembered_layouts_give_the_full_checks_answers():
    checks, signature = RequestChecks(), _signature()
    for rows in (1, 3, 1, 3, 7):
        inputs = _inputs(rows)
        expected = (Rows(batch_size(signature, inputs), rows), estimate_request_bytes(signature, inputs, rows))
        assert checks.check(signature, inputs) == expected == (Rows(rows, rows), rows * (16 + 8 + 8))


@pytest.mark.parametrize("bad", [
    {"x": np.zeros((2, 4), np.float64), "k": np.zeros((2,), np.int64)},   # dtype
    {"x": np.zeros((2, 5), np.float32), "k": np.zeros((2,), np.int64)},   # fixed dim
    {"x": np.zeros((2, 4), np.float32), "k": np.zeros((3,), np.int64)},   # batch sizes disagree
    {"x": np.zeros((2, 4), np.float32)},                                  # missing input
])
def test_a_bad_layout_is_refused_every_time_with_the_full_message(bad):
    checks, signature = RequestChecks(), _signature()
    with pytest.raises(InvalidRequestError) as full:
        validate_inputs(signature, bad)
    for _ in range(3):  # never remembered as valid
        with pytest.raises(InvalidRequestError) as remembered:
            checks.check(signature, bad)
        assert str(remembered.value) == str(full.value)


def test_a_layout_valid_for_one_signature_is_checked_again_for_another():
    checks = RequestChecks()
    narrow, wide = _signature(4), _signature(5)
    assert checks.check(narrow, _inputs(2, 4)) == (Rows(2, 2), 64)
    with pytest.raises(InvalidRequestError, match="dimension 1 must be 5"):
        checks.check(wide, _inputs(2, 4))


@pytest.mark.parametrize(("dtype", "item"), [("bfloat16", 2), ("float8_e4m3fn", 1), ("int4", 1), ("resource", 1)])
def test_tensorflow_only_output_dtypes_are_estimated_and_client_errors_stay_client_errors(dtype, item):
    """An output dtype numpy cannot name (a SavedModel may declare one) is counted, never an INTERNAL TypeError."""
    signature = Signature("serving_default", {"x": TensorSpec("float32", (None, 2))}, {"y": TensorSpec(dtype, (None, 3))})
    assert RequestChecks().check(signature, {"x": np.zeros((4, 2), np.float32)}) == (Rows(4, 4), 4 * 8 + 4 * 3 * item)
    assert RequestChecks().check(signature, {"x": np.zeros((0, 2), np.float32)})[0].batch == 0  # refused later: 0 rows
    with pytest.raises(InvalidRequestError):
        RequestChecks().check(signature, {"x": np.zeros((1, 2), np.float64)})


def test_the_memo_is_bounded():
    checks, signature = RequestChecks(max_entries=4), _signature()
    for rows in range(1, 20):
        checks.check(signature, _inputs(rows))
        assert len(checks._known) <= 4


def _samples(text: bytes, prefix: str) -> list[str]:
    return sorted(line for line in text.decode().splitlines() if line.startswith(prefix))


def _created_series(text: bytes) -> list[str]:
    """`_created` lines without their values (the time each series began differs between the two registries)."""
    return sorted(line.rsplit(" ", 1)[0] for line in text.decode().splitlines() if "_created" in line)


def test_request_stats_render_as_prometheus_clients_counter_and_histogram():
    latencies = [0.0001, 0.0005, 0.0007, 0.003, 0.02, 0.02, 0.7, 3.0, 42.0]
    stats, ours = RequestStats(), CollectorRegistry()
    ours.register(stats)
    theirs = CollectorRegistry()
    counter = Counter("tfship_requests", "Requests by model, version, method and status code.",
                      ["model", "version", "method", "status"], registry=theirs)
    histogram = Histogram("tfship_request_latency_seconds", "Request latency in seconds.", ["model", "method"],
                          registry=theirs, buckets=LATENCY_BUCKETS_S)
    for i, seconds in enumerate(latencies):
        status = "OK" if i % 3 else "INVALID_ARGUMENT"
        stats.record("digits", "2", "predict", status, seconds)
        counter.labels("digits", "2", "predict", status).inc()
        histogram.labels("digits", "predict").observe(seconds)
    for prefix in ("tfship_requests_total", "tfship_request_latency_seconds_bucket",
                   "tfship_request_latency_seconds_count", "tfship_request_latency_seconds_sum"):
        assert _samples(generate_latest(ours), prefix) == _samples(generate_latest(theirs), prefix), prefix
    assert _created_series(generate_latest(ours)) == _created_series(generate_latest(theirs))
    series = [line for line in _created_series(generate_latest(ours)) if not line.startswith("#")]
    assert len(series) == 3  # one per label set: 2 counters, 1 histogram
    assert 'tfship_requests_total{method="predict",model="digits",status="OK",version="2"} 6.0' in \
        generate_latest(ours).decode()


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def _call(target: str, message) -> bytes:
    with grpc.insecure_channel(target) as channel:
        return channel.unary_unary(PREDICT, request_serializer=None, response_deserializer=None)(
            message.SerializeToString(), timeout=60)


def test_large_typed_requests_decode_in_the_helper_process_and_tensor_content_on_the_loop(tmp_path):
    """Requests above OFF_LOOP_BYTES: typed `float_val` decodes in the helper process (started on first use),
    `tensor_content` as a view on the loop; both answers equal the request's values (identity backend)."""
    from bench.serve.models import ModelInfo, write_identity

    write_identity(tmp_path / "repo" / "echo" / "1", ModelInfo("echo", "x", (784,), "test"))
    values = np.random.default_rng(0).random((400, 784), dtype=np.float32)  # 1.25 MB as tensor_content
    content = protocol.PredictRequest()
    content.model_spec.name = "echo"
    content.inputs["x"].CopyFrom(to_tensor_proto(values))
    typed = protocol.PredictRequest()
    typed.model_spec.name = "echo"
    typed.inputs["x"].dtype = content.inputs["x"].dtype
    typed.inputs["x"].tensor_shape.CopyFrom(content.inputs["x"].tensor_shape)
    typed.inputs["x"].float_val.extend(values.reshape(-1).tolist())
    assert content.ByteSize() > OFF_LOOP_BYTES and typed.ByteSize() > OFF_LOOP_BYTES
    with ServerProcess(tmp_path / "repo", "echo", "auto", ["--rest-port", "-1", "--file-system-poll-wait-seconds", "0"],
                       startup_timeout_s=60, module="bench.serve.identity") as server:
        answer = protocol.PredictResponse.FromString(_call(server.grpc_target, content))
        np.testing.assert_array_equal(from_tensor_proto(answer.outputs["x"]), values)
        assert not _children(server.process.pid)  # tensor_content: decoded on the loop, no helper started
        answer = protocol.PredictResponse.FromString(_call(server.grpc_target, typed))
        np.testing.assert_array_equal(from_tensor_proto(answer.outputs["x"]), values)
        assert _children(server.process.pid)  # float_val: the helper process decoded it


def test_large_typed_v2_infer_requests_decode_in_the_helper_process_too(tmp_path):
    """The same rule on the Open Inference Protocol's ModelInfer: typed `fp32_contents` above OFF_LOOP_BYTES
    decode in the helper process, `raw_input_contents` on the loop; both answers equal the values sent."""
    from bench.serve.models import ModelInfo, write_identity
    from tfship.core import kserve_protocol as kp

    write_identity(tmp_path / "repo" / "echo" / "1", ModelInfo("echo", "x", (784,), "test"))
    values = np.random.default_rng(1).random((400, 784), dtype=np.float32)

    def request(raw: bool):
        message = kp.ModelInferRequest(model_name="echo")
        tensor = message.inputs.add(name="x", datatype="FP32", shape=list(values.shape))
        if raw:
            message.raw_input_contents.append(values.tobytes())
        else:
            tensor.contents.fp32_contents.extend(values.reshape(-1).tolist())
        assert message.ByteSize() > OFF_LOOP_BYTES
        return message

    with ServerProcess(tmp_path / "repo", "echo", "auto", ["--rest-port", "-1", "--file-system-poll-wait-seconds", "0"],
                       startup_timeout_s=60, module="bench.serve.identity") as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            infer = channel.unary_unary(f"/{kp.SERVICE}/ModelInfer", request_serializer=None,
                                        response_deserializer=None)
            answer = kp.ModelInferResponse.FromString(infer(request(raw=True).SerializeToString(), timeout=60))
            np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(values.shape),
                                          values)
            assert not _children(server.process.pid)
            answer = kp.ModelInferResponse.FromString(infer(request(raw=False).SerializeToString(), timeout=60))
            typed = np.array(answer.outputs[0].contents.fp32_contents, np.float32).reshape(values.shape)
            np.testing.assert_array_equal(typed, values)
            assert _children(server.process.pid)


@pytest.mark.parametrize(("tf_error", "code"), [("AbortedError", "ABORTED"), ("NotFoundError", "NOT_FOUND")])
def test_a_models_own_status_on_an_input_off_the_signature_is_the_clients_fault(tf_error, code):
    """On some CPUs oneDNN's max-pooling answers a wrong image with AbortedError, on others InvalidArgumentError: off
    the signature, either is INVALID_ARGUMENT naming the input; on a conforming input the model's status stands."""
    from tfship.core.errors import ModelError
    from tfship.serving.dataplane.contract import refault

    signature = Signature("serving_default", {"image": TensorSpec("float32", (None, 8, 8, 1))},
                          {"y": TensorSpec("float32", (None, 10))})
    failed = ModelError(f"signature 'serving_default' failed in the model: {tf_error}: could not create a descriptor",
                        code)
    fault = refault(failed, signature, {"image": np.zeros((1, 8, 8, 2), np.float32)}, "saved_model")
    assert isinstance(fault, InvalidRequestError) and fault.grpc_code == "INVALID_ARGUMENT"
    assert "image" in str(fault) and tf_error in str(fault)
    assert refault(failed, signature, {"image": np.zeros((1, 8, 8, 1), np.float32)}, "saved_model") is None
