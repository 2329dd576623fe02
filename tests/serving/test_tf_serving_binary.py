"""TF Serving's binary behaviour, kind by kind (issue 19), on half-plus-two models built here.

One server, started with a TF Serving command line: a TF1 half-plus-two (fed by tensor name), a TF2 one
(function input signature [-1, 1]) and two TFLite ones without signature runners (`--prefer_tflite_model`, as
TF Serving's own TFLite test models) from a `--model_config_file`, a Unix socket beside TCP, channel
arguments that act (`grpc.max_receive_message_length`), the method-name check and CORS on. Answers are read as TF
Serving's clients read them: `result.outputs["y"].float_val`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from half_plus_two import build_tf1, build_tf2, build_tflite_without_runners
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_service_pb2_grpc

from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.contract import validate_inputs
from tfship.serving.dataplane.inference import ExampleMethod, output_aliases
from tfship.serving.dataplane.types import InferenceResponse
from tfship.serving.launcher import ServerProcess
from tfship.serving.runtimes import REGISTRY, RuntimeOptions
from tfship.serving.tfs import converters

RECEIVE_LIMIT = 64 << 10  # --grpc_channel_arguments grpc.max_receive_message_length, bytes


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("half")
    build_tf1(root / "half_plus_two" / "1")
    build_tf2(root / "half_plus_two_tf2" / "1")
    build_tflite_without_runners(root / "half_plus_two_tflite" / "1")
    build_tflite_without_runners(root / "half_plus_two_tflite_sigdef" / "1", signature_defs=True)
    names = ("half_plus_two", "half_plus_two_tf2", "half_plus_two_tflite", "half_plus_two_tflite_sigdef")
    (root / "models.config").write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" }}\n'
        for name in names) + "}\n")
    return root


@pytest.fixture(scope="module")
def server(models: Path):
    socket_path = models / "tfs.sock"
    args = ["--model_config_file", str(models / "models.config"), f"--grpc_socket_path={socket_path}",
            f"--grpc_channel_arguments=grpc.max_connection_age_ms=60000,grpc.max_receive_message_length="
            f"{RECEIVE_LIMIT},grpc.so_reuseaddr=1", "--enable_signature_method_name_check=true",
            "--rest_api_enable_cors_support", "--prefer_tflite_model=true", "--num_load_threads=2", "--rest_api_num_threads=4",
            "--file_system_poll_wait_seconds=0"]
    with ServerProcess(models, "half_plus_two", extra_args=args) as proc:
        proc.socket_path = socket_path
        yield proc


def _predict(target: str, model: str, x: np.ndarray, timeout: float = 30.0):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    tensor = request.inputs["x"]
    tensor.dtype = types_pb2.DT_FLOAT
    tensor.float_val.extend(x.reshape(-1).tolist())
    for size in x.shape:
        tensor.tensor_shape.dim.add().size = size
    with grpc.insecure_channel(target) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout)


def test_answers_fill_the_typed_fields_as_tf_serving_does(server):
    result = _predict(server.grpc_target, "half_plus_two", np.array([[2.0]], np.float32))
    y = result.outputs["y"]
    assert y.dtype == types_pb2.DT_FLOAT and list(y.float_val) == [3.0] and not y.tensor_content
    assert [d.size for d in y.tensor_shape.dim] == [1, 1]
    assert (result.model_spec.name, result.model_spec.version.value) == ("half_plus_two", 1)


def test_a_graph_model_decides_the_shapes_it_accepts(server):
    """TF Serving feeds tensors by name: a [3] tensor into an input declared [-1, 1] gives y = [3.0, 3.5, 4.0]."""
    y = _predict(server.grpc_target, "half_plus_two", np.array([2.0, 3.0, 4.0], np.float32)).outputs["y"]
    assert list(y.float_val) == [3.0, 3.5, 4.0] and [d.size for d in y.tensor_shape.dim] == [3]


def test_what_the_model_refuses_is_invalid_argument(server):
    with pytest.raises(grpc.RpcError) as caught:  # the TF2 function's input signature refuses rank 1
        _predict(server.grpc_target, "half_plus_two_tf2", np.array([2.0, 3.0, 4.0], np.float32))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "TensorFlow rejected" in caught.value.details()
    y = _predict(server.grpc_target, "half_plus_two_tf2", np.array([[2.0], [4.0]], np.float32)).outputs["y"]
    assert list(y.float_val) == [3.0, 4.0]


@pytest.mark.parametrize(("model", "output"), [("half_plus_two_tflite", "Identity"),
                                               ("half_plus_two_tflite_sigdef", "y")])
def test_tflite_files_without_signature_runners_are_served_as_tf_serving_serves_them(server, model, output):
    """Signatures from `signature_defs_metadata`, else the tensors by name; inputs resized to what is fed."""
    result = _predict(server.grpc_target, model, np.array([2.0], np.float32))  # a [1] into the file's [1, 1]
    assert list(result.outputs[output].float_val) == [3.0]
    result = _predict(server.grpc_target, model, np.array([[2.0], [4.0]], np.float32))
    assert list(result.outputs[output].float_val) == [3.0, 4.0]


def test_unix_socket_serves_the_same_api(server):
    y = _predict(f"unix:{server.socket_path}", "half_plus_two", np.array([[6.0]], np.float32)).outputs["y"]
    assert list(y.float_val) == [5.0]


def test_channel_arguments_act_on_the_server(server):
    small = np.zeros((1000, 1), np.float32)  # ~4 KB on the wire with float_val
    assert len(_predict(server.grpc_target, "half_plus_two", small).outputs["y"].float_val) == 1000
    large = np.zeros((2 * RECEIVE_LIMIT // 4, 1), np.float32)  # twice the receive limit
    with pytest.raises(grpc.RpcError) as caught:  # refused by gRPC itself, before any handler runs
        _predict(server.grpc_target, "half_plus_two", large)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in caught.value.details()


def test_cors_support_adds_tf_servings_headers_and_answers_preflights(server):
    import requests

    url = f"{server.rest_url}/v1/models/half_plus_two"
    response = requests.get(url, timeout=30)
    assert response.status_code == 200 and response.headers["Access-Control-Allow-Origin"] == "*"
    assert response.headers["Access-Control-Allow-Methods"] == "POST, GET"
    preflight = requests.options(url + ":predict", headers={"Origin": "https://app.example"}, timeout=30)
    assert preflight.status_code == 200 and preflight.headers["Access-Control-Allow-Headers"] == "Content-Type"
    refused = requests.options(url + ":predict", timeout=30)
    assert refused.status_code == 400 and refused.json() == {"error": "Origin header is missing in CORS preflight"}
    assert requests.get(f"{server.rest_url}/v1/models/nope", timeout=30).headers["Access-Control-Allow-Origin"] == "*"


def test_method_name_check_when_enabled(server):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "half_plus_two"
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as caught:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Classify(request, 30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("Expected classification signature method_name to be "
                                             "tensorflow/serving/classify. Was: tensorflow/serving/predict")


def test_method_name_check_function_is_off_by_default():
    predict = Signature("serving_default", inputs={}, outputs={}, method_name="tensorflow/serving/predict")
    with pytest.raises(InvalidRequestError, match="Expected one input Tensor"):  # the shape refuses it, not
        output_aliases(predict, ExampleMethod.REGRESS)                            # the method_name (default)
    with pytest.raises(InvalidRequestError, match="Expected regression signature method_name to be "):
        output_aliases(predict, ExampleMethod.REGRESS, check_method_name=True)


def test_shape_checks_stay_for_backends_that_need_them():
    signature = Signature("s", inputs={"x": TensorSpec("float32", (None, 1))}, outputs={})
    validate_inputs(signature, {"x": np.zeros(3, np.float32)}, shapes=False)  # SavedModel: the model decides
    with pytest.raises(InvalidRequestError, match="expected rank 2"):  # ONNX / LiteRT
        validate_inputs(signature, {"x": np.zeros(3, np.float32)})
    with pytest.raises(InvalidRequestError, match="expected dtype float32"):  # names and dtypes always
        validate_inputs(signature, {"x": np.zeros(3, np.float64)}, shapes=False)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "int16", "int32", "uint8", "uint16",
                                   "int64", "uint32", "uint64", "bool", "complex64", "complex128", "object"])
def test_both_encodings_decode_to_the_same_array(dtype):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    array = (np.array([[b"a", b"bc"], [b"", b"\xff"]], dtype=object) if dtype == "object"
             else (rng.random((2, 3)) * 100 + 1j * rng.random((2, 3)) if dtype.startswith("complex")
                   else rng.random((2, 3)) * 100).astype(dtype))
    response = InferenceResponse("m", 1, "serving_default", {"y": array, "scalar": array[0, 0], "empty": array[:0]})
    typed = converters.predict_response(response).outputs
    raw = converters.predict_response(response, tensor_content=True).outputs
    assert not typed["y"].tensor_content and (dtype == "object" or raw["y"].tensor_content)
    for outputs in (typed, raw):
        for key, want in response.outputs.items():
            np.testing.assert_array_equal(tf.make_ndarray(outputs[key]), want)


def test_prefer_tflite_model_picks_litert_where_a_version_has_model_tflite(tmp_path):
    import tensorflow as tf

    version = build_tf2(tmp_path / "m" / "1")
    assert REGISTRY.create("auto", version, RuntimeOptions(prefer=("tflite",))).name == "saved_model"  # no file
    converter = tf.lite.TFLiteConverter.from_saved_model(str(version))
    (version / "model.tflite").write_bytes(converter.convert())
    assert REGISTRY.create("auto", version, RuntimeOptions(prefer=("tflite",))).name == "tflite"
    assert REGISTRY.create("auto", version, RuntimeOptions()).name == "saved_model"


def test_bad_model_config_file_is_reported_in_tf_servings_words(tmp_path):
    config = tmp_path / "bad.config"
    config.write_text("model_config_list { config { name: 'x' base_path: '/m' } } extra_junk {\n")
    done = subprocess.run([sys.executable, "-c", "import sys; from tfship.serving.cli import tensorflow_model_server;"
                           " sys.exit(tensorflow_model_server())", "--port=0", f"--model_config_file={config}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in done.stderr
