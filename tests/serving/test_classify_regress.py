"""Classify, Regress and MultiInference (gRPC) and `:classify` / `:regress` (REST) on a TF1 ParseExample graph.

The model (`tf1_models.build_tf1_example_model`) is a `SavedModelBuilder` graph with the empty placeholder
shape of old exports, which `tf.saved_model.load` refuses; the server loads it as TF Serving does (a graph in
a Session). Requests are built with TF Serving's own client classes and TensorFlow's `tf.train.Example`;
every answer is compared with the same graph run directly in a TensorFlow Session, and with its formula.
"""

from __future__ import annotations

import asyncio
import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from conftest import MODEL as DIGITS
from tf1_models import CLASSES, build_tf1_example_model, build_tf2_example_model, expected_y

from tfship.core.errors import InvalidRequestError, UnimplementedError
from tfship.serving.dataplane.inference import ExampleMethod, ExamplesRequest, ExampleTask
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import from_repository
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ModelRef, ServerLimits
from tfship.serving.launcher import ServerProcess
from tfship.serving.operations.metrics import Metrics
from tfship.serving.runtimes import RuntimeOptions

MODEL = "tf1"
MAX_MESSAGE = 1000  # every error message stays below this many characters


@pytest.fixture(scope="module")
def tf1_repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("tf1-repo")
    build_tf1_example_model(repo / MODEL / "1")
    return repo


@pytest.fixture(scope="module")
def tf1_server(tf1_repository):
    with ServerProcess(tf1_repository, MODEL) as proc:
        yield proc


@pytest.fixture(scope="module")
def stub(tf1_server):
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(tf1_server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def graph(tf1_repository):
    """Run the SavedModel's graph directly: fetch(tensor names, serialized examples) -> arrays."""
    import tensorflow as tf

    session = tf.compat.v1.Session(graph=tf.Graph())
    with session.graph.as_default():
        tf.compat.v1.saved_model.load(session, ["serve"], str(tf1_repository / MODEL / "1"))

    def fetch(names: list[str], serialized: list[bytes]) -> list[np.ndarray]:
        return session.run(names, feed_dict={"tf_example:0": np.array(serialized, dtype=object)})

    yield fetch
    session.close()


def _example(**features):
    import tensorflow as tf

    example = tf.train.Example()
    for name, value in features.items():
        feature = example.features.feature[name]
        if isinstance(value, bytes):
            feature.bytes_list.value.append(value)
        elif isinstance(value, int):
            feature.int64_list.value.append(value)
        else:
            feature.float_list.value.append(value)
    return example


ROWS = [{"x": 2.0, "k": 3.0}, {"x": -1.5}, {}]  # k defaults to 1.0, x to 0.0


def _request(kind: str, signature: str, rows=ROWS, context=None):
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    request = (classification_pb2.ClassificationRequest() if kind == "classify" else regression_pb2.RegressionRequest())
    request.model_spec.name = MODEL
    request.model_spec.signature_name = signature
    target = request.input.example_list_with_context if context else request.input.example_list
    if context:
        target.context.CopyFrom(_example(**context))
    for row in rows:
        target.examples.add().CopyFrom(_example(**row))
    return request


def _serialized(rows=ROWS, context=None) -> list[bytes]:
    prefix = _example(**context).SerializeToString() if context else b""
    return [prefix + _example(**row).SerializeToString() for row in rows]


def test_tf_saved_model_load_refuses_the_graph_the_server_serves(tf1_repository):
    import tensorflow as tf

    with pytest.raises(ValueError, match="Shape must be rank 1 but is rank 0"):
        tf.saved_model.load(str(tf1_repository / MODEL / "1"))


def test_grpc_classify_answers_what_the_graph_computes(stub, graph):
    response = stub.Classify(_request("classify", "classify_x_to_y"), timeout=30)
    labels, scores = graph(["classes:0", "scores:0"], _serialized())
    assert (response.model_spec.name, response.model_spec.version.value, response.model_spec.signature_name) == (
        MODEL, 1, "classify_x_to_y")
    got = [[(c.label, c.score) for c in row.classes] for row in response.result.classifications]
    assert got == [[(lab.decode(), float(s)) for lab, s in zip(lrow, srow)] for lrow, srow in zip(labels, scores)]
    want = [expected_y(2.0, 3.0), expected_y(-1.5), expected_y(0.0)]
    assert got == [[(CLASSES[0], y), (CLASSES[1], -y)] for y in want]


def test_grpc_classify_scores_only_and_context_merge(stub, graph):
    context = {"k": 2.0, "x": 10.0}
    rows = [{"x": 1.0}, {"k": 4.0}]  # an example's feature replaces the context's
    response = stub.Classify(_request("classify", "classify_scores_only", rows, context), timeout=30)
    (scores,) = graph(["scores:0"], _serialized(rows, context))
    got = [[(c.label, c.score) for c in row.classes] for row in response.result.classifications]
    assert got == [[("", float(s)) for s in row] for row in scores]
    assert [row[0][1] for row in got] == [expected_y(1.0, 2.0), expected_y(10.0, 4.0)]


@pytest.mark.parametrize("signature", ["regress_x_to_y", "", "serving_default"])  # "" is serving_default
def test_grpc_regress_on_regression_and_predict_signatures(stub, graph, signature):
    response = stub.Regress(_request("regress", signature), timeout=30)
    (y,) = graph(["y:0"], _serialized())
    assert [r.value for r in response.result.regressions] == y.reshape(-1).tolist()
    assert response.model_spec.signature_name == (signature or "serving_default")
    assert response.model_spec.version.value == 1


def test_grpc_multi_inference_runs_each_task_on_one_version(stub, graph):
    from tensorflow_serving.apis import inference_pb2

    request = inference_pb2.MultiInferenceRequest()
    for signature, method in (("classify_x_to_y", "tensorflow/serving/classify"),
                              ("regress_x_to_y", "tensorflow/serving/regress")):
        task = request.tasks.add(method_name=method)
        task.model_spec.name = MODEL
        task.model_spec.signature_name = signature
    request.input.example_list.examples.extend(_example(**row) for row in ROWS)
    response = stub.MultiInference(request, timeout=30)
    scores, y = graph(["scores:0", "y:0"], _serialized())
    classified, regressed = response.results
    assert [[c.score for c in row.classes] for row in classified.classification_result.classifications] == \
        scores.tolist()
    assert [r.value for r in regressed.regression_result.regressions] == y.reshape(-1).tolist()
    assert [(r.model_spec.signature_name, r.model_spec.version.value) for r in response.results] == [
        ("classify_x_to_y", 1), ("regress_x_to_y", 1)]


def test_predict_feeds_a_graph_tensor_by_name(tf1_server):
    from tfship.serving.tfs.client import PredictClient

    with PredictClient(tf1_server.grpc_target) as client:
        out = client.predict(MODEL, {"x": np.array([[2.0], [4.0]], np.float32)}, signature_name="predict_x")
    assert out["y"].tolist() == [[expected_y(2.0)], [expected_y(4.0)]]


def _post(server, verb: str, body) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{MODEL}:{verb}", data=json.dumps(body), timeout=30)


def test_rest_classify_and_regress(tf1_server, graph):
    examples = [{"x": 2.0, "k": [3.0], "note": {"b64": base64.b64encode(b"\xff\x00").decode()}},
                {"x": [-1.5], "tag": "text", "n": 7}]  # unused features of every kind are parsed and ignored
    rows = [{"x": 2.0, "k": 3.0, "note": b"\xff\x00"}, {"x": -1.5, "tag": b"text", "n": 7}]
    answer = _post(tf1_server, "classify", {"signature_name": "classify_x_to_y", "examples": examples})
    assert answer.status_code == 200, answer.text
    labels, scores = graph(["classes:0", "scores:0"], _serialized(rows))
    assert answer.json() == {"results": [[[lab.decode(), float(s)] for lab, s in zip(lrow, srow)]
                                         for lrow, srow in zip(labels, scores)]}
    answer = _post(tf1_server, "regress", {"context": {"k": 2.0}, "examples": [{"x": 1.0}, {"x": 3.0, "k": 1.0}]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"results": [expected_y(1.0, 2.0), expected_y(3.0, 1.0)]}


@pytest.mark.parametrize(("body", "fragment"), [
    ({"examples": [{"x": None}]}, "Feature: x has element with unexpected JSON type: Null"),
    ({"examples": [{"x": [1.0, 2]}]}, "Unexpected element type in feature: x expecting type: float"),
    ({"examples": [{"x": [[1.0]]}]}, "Feature: x has element with unexpected JSON type: Array"),
    ({"examples": [{"x": 2**63}]}, "Only int64_t is supported"),
    ({"examples": [7]}, "Example must be JSON object but got JSON Number"),
    ({"examples": {"x": 1.0}}, "Expecting 'examples' value to be an list/array"),
    ({"examples": [{"x": 1}]}, "x"),  # an int64 feature where the graph parses float: the model refuses it
    ({"signature_name": "predict_x", "examples": [{"x": 1.0}]}, "No regression inputs found in SignatureDef"),
])
def test_rest_bad_examples_are_400_with_bounded_messages(tf1_server, body, fragment):
    answer = _post(tf1_server, "regress", body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert fragment in message and len(message) < MAX_MESSAGE


def _multi(tasks):
    from tensorflow_serving.apis import inference_pb2

    request = inference_pb2.MultiInferenceRequest()
    for model, signature, method in tasks:
        task = request.tasks.add(method_name=method)
        task.model_spec.name = model
        task.model_spec.signature_name = signature
    request.input.example_list.examples.add().CopyFrom(_example(x=1.0))
    return request


@pytest.mark.parametrize(("method", "make", "code", "fragment"), [
    ("Classify", lambda: _request("classify", "predict_x"), "INVALID_ARGUMENT", "No classification inputs found"),
    ("Classify", lambda: _request("classify", "nope"), "INVALID_ARGUMENT", "No signature was found with the name: nope"),
    ("Regress", lambda: _request("regress", "classify_x_to_y"), "INVALID_ARGUMENT", "Expected one output Tensor."),
    ("Regress", lambda: _request("regress", "regress_x_to_y", rows=[]), "INVALID_ARGUMENT", "Input is empty."),
    ("Regress", lambda: _request("regress", "regress_x_to_y", rows=[{"x": 7}]), "INVALID_ARGUMENT", "x"),
    ("Regress", lambda: _request("regress", "regress_x_to_y", rows=[{"k": b"abc"}]), "INVALID_ARGUMENT", "k"),
    ("MultiInference", lambda: _multi([(MODEL, "regress_x_to_y", "tensorflow/serving/regress")] * 2),
     "INVALID_ARGUMENT", "Duplicate evaluation of signature: regress_x_to_y"),
    ("MultiInference", lambda: _multi([(MODEL, "regress_x_to_y", "tensorflow/serving/regress"),
                                       ("other", "classify_x_to_y", "tensorflow/serving/classify")]),
     "INVALID_ARGUMENT", "must access the same model name"),
    ("MultiInference", lambda: _multi([(MODEL, "regress_x_to_y", "tensorflow/serving/predict")]),
     "UNIMPLEMENTED", "Unsupported signature method_name: tensorflow/serving/predict"),
    ("MultiInference", lambda: _multi([(MODEL, "nope", "tensorflow/serving/regress")]),
     "INVALID_ARGUMENT", "Requested signature not found in model graph: nope"),
])
def test_grpc_refusals_are_client_errors_with_bounded_messages(stub, method, make, code, fragment):
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, method)(make(), timeout=30)
    assert caught.value.code().name == code
    assert fragment in caught.value.details() and len(caught.value.details()) < MAX_MESSAGE


def _infer(backend: str, repository: Path, name: str, task: ExampleTask, check_method_name: bool = False):
    """Run one task in-process on a data plane serving `name` from `repository` with `backend`."""
    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = ModelManager(backend, RuntimeOptions(), pool)
            dataplane = DataPlane(manager, pool, ServerLimits(), Metrics())
            dataplane.signature_method_name_check = check_method_name
            await manager.apply_config(from_repository(repository, name))
            try:
                examples = np.array(_serialized([{"x": 1.0}]), dtype=object)
                return await dataplane.infer_examples(ExamplesRequest(ModelRef(name), (task,), examples))
            finally:
                await manager.unload_all()

    return asyncio.run(run())


def test_method_name_check_is_off_unless_asked(tf1_repository):
    task = ExampleTask(ExampleMethod.REGRESS, "serving_default")  # a predict signature shaped for Regress
    assert _infer("saved_model", tf1_repository, MODEL, task).results[0].result.values.tolist() == [expected_y(1.0)]
    with pytest.raises(InvalidRequestError, match="Expected regression signature method_name to be "
                                                  "tensorflow/serving/regress. Was: tensorflow/serving/predict"):
        _infer("saved_model", tf1_repository, MODEL, task, check_method_name=True)


def test_tf2_saved_model_with_parse_example_signatures(tmp_path):
    build_tf2_example_model(tmp_path / "tf2" / "1")
    regressed = _infer("saved_model", tmp_path, "tf2", ExampleTask(ExampleMethod.REGRESS, "regress_x_to_y"))
    assert regressed.results[0].result.values.tolist() == [expected_y(1.0)]
    classified = _infer("saved_model", tmp_path, "tf2", ExampleTask(ExampleMethod.CLASSIFY, "classify_x_to_y"))
    result = classified.results[0].result
    assert result.labels is None and result.scores.tolist() == [[expected_y(1.0), -expected_y(1.0)]]


def test_runtime_feeds_shapes_the_graph_accepts_as_tf_serving_does(tf1_repository):
    """A [2] tensor fed to `x` declared [-1, 1]: the graph's ops take it (TF Serving answers it); a wrong dtype
    is the graph's refusal, INVALID_ARGUMENT; an output that is an input comes back as fed.
    """
    from tfship.serving.runtimes.base import ModelInputError
    from tfship.serving.runtimes.saved_model import SavedModelRuntime

    runtime = SavedModelRuntime(tf1_repository / MODEL / "1")
    runtime.load()
    try:
        assert runtime.predict({"x": np.array([2.0, 4.0], np.float32)}, "predict_x")["y"].tolist() == [
            expected_y(2.0), expected_y(4.0)]
        with pytest.raises(ModelInputError, match="Type mismatch"):
            runtime.predict({"x": np.array([[2.0]], np.float64)}, "predict_x")
        examples = np.array(_serialized([{"x": 2.0}]), dtype=object)  # an output that is the fed tensor itself
        echo = runtime.predict({"inputs": examples}, "echo")
        assert echo["echoed"].tolist() == examples.tolist() and echo["outputs"].tolist() == [[expected_y(2.0)]]
    finally:
        runtime.unload()


def test_onnx_backend_answers_unimplemented_naming_why(repository):
    with pytest.raises(UnimplementedError, match="only the saved_model backend can parse; model 'digits' version 2 "
                                                 "is served by the onnx backend: call Predict"):
        _infer("onnx", repository, DIGITS, ExampleTask(ExampleMethod.CLASSIFY, "serving_default"))
