"""Regression tests for QA's attacks: bad reload configs, failed-version retry, tensor decoding bounds,
malformed requests over gRPC and REST, batch queue capacity and `serve` flag errors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import MODEL
from google.protobuf import text_format

from tfship.core import protocol
from tfship.core.errors import ConfigError, InvalidRequestError, ModelNotFoundError, ResourceExhaustedError
from tfship.serving import cli
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import parse_model_server_config
from tfship.serving.dataplane.tensors import from_tensor_proto, to_tensor_proto
from tfship.serving.dataplane.types import ModelRef, VersionState
from tfship.serving.launcher import ServerProcess
from tfship.serving.runtimes import RuntimeOptions
from tfship.serving.tfs import converters
from tfship.serving.tfs.client import PredictClient, RemoteError

TOKEN = "hardening-token"
ADMIN_TOKEN = "hardening-admin-token"


def _copy(repository: Path, root: Path, version: int, broken: bool = False) -> Path:
    staging = root / MODEL / f".staging-{version}"
    shutil.copytree(repository / MODEL / str(version), staging)
    if broken:
        (staging / "model.tflite").write_bytes(b"not a flatbuffer")
    return staging.rename(root / MODEL / str(version))


def _entry(base_path: str, extra: str = "", platform: str = "tensorflow") -> str:
    return (f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{base_path}" '
            f'model_platform: "{platform}" {extra} }} }}')


def _bad_configs(base: Path) -> dict[str, tuple[str, str]]:
    """name -> (config text, text the refusal must contain)."""
    return {
        "nonexistent base_path": (_entry("/nonexistent/x"), "'/nonexistent/x' does not exist"),
        "relative base_path": (_entry("relative/x"), "base_path 'relative/x' must be an absolute path"),
        "base_path is a file": (_entry(f"{base}/1/model.tflite"), "is not a folder"),
        "specific without versions": (_entry(str(base), "model_version_policy { specific { } }"),
                                      "specific.versions must list positive versions"),
        "specific version missing": (_entry(str(base), "model_version_policy { specific { versions: 77 } }"),
                                     "specific.versions [77] not found"),
        "unknown platform": (_entry(str(base), platform="pytorch"), "model_platform 'pytorch'"),
        "label to missing version": (_entry(str(base), 'version_labels { key: "stable" value: 5 }'),
                                     "version_labels {'stable': 5}"),
    }


def _manager(pool) -> ModelManager:
    return ModelManager("tflite", RuntimeOptions(), pool)


@pytest.mark.parametrize("case", list(_bad_configs(Path("/b"))))
def test_bad_reload_config_is_refused_and_old_config_keeps_serving(repository, tmp_path, case):
    _copy(repository, tmp_path, 1)
    text, message = _bad_configs(tmp_path / MODEL)[case]

    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = _manager(pool)
            await manager.apply_config(parse_model_server_config(_entry(str(tmp_path / MODEL))))
            with pytest.raises(ConfigError) as err:
                await manager.apply_config(parse_model_server_config(text))
            assert message in str(err.value)
            return manager.resolve(ModelRef(MODEL)).version

    assert asyncio.run(run()) == 1


def test_reload_keeps_old_version_when_new_one_fails_and_empty_config_unloads_all(repository, tmp_path):
    _copy(repository, tmp_path, 1)
    _copy(repository, tmp_path, 2, broken=True)
    base = tmp_path / MODEL

    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = _manager(pool)
            await manager.apply_config(parse_model_server_config(
                _entry(str(base), "model_version_policy { specific { versions: 1 } }")))
            await manager.apply_config(parse_model_server_config(
                _entry(str(base), "model_version_policy { latest { num_versions: 0 } }")))
            statuses = {s.version: s for s in manager.statuses(ModelRef(MODEL))}
            assert statuses[2].state is VersionState.END and "model.tflite" in statuses[2].error_message
            assert manager.resolve(ModelRef(MODEL)).version == 1  # latest{0} means 1, v2 failed: v1 serves
            await manager.apply_config(parse_model_server_config(""))  # explicitly empty: unload all (TF Serving)
            with pytest.raises(ModelNotFoundError):
                manager.resolve(ModelRef(MODEL))

    asyncio.run(run())


def test_failed_version_is_retried_once_its_folder_changes(repository, tmp_path):
    _copy(repository, tmp_path, 1)
    broken = _copy(repository, tmp_path, 2, broken=True)

    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = _manager(pool)
            await manager.apply_config(parse_model_server_config(_entry(str(tmp_path / MODEL))))
            assert manager.statuses(ModelRef(MODEL, version=2))[0].state is VersionState.END
            await manager.reconcile()  # unchanged folder: not retried, still reported
            assert manager.statuses(ModelRef(MODEL, version=2))[0].error_message
            shutil.copy(repository / MODEL / "2" / "model.tflite", broken / "model.tflite")  # the copy completes
            await manager.reconcile()
            assert manager.resolve(ModelRef(MODEL)).version == 2
            shutil.rmtree(broken)  # removed, then published again broken, then good: each change is retried
            _copy(repository, tmp_path, 2, broken=True)
            await manager.reconcile()
            shutil.rmtree(broken)
            await manager.reconcile()
            _copy(repository, tmp_path, 2)
            await manager.reconcile()
            return manager.resolve(ModelRef(MODEL)).version

    assert asyncio.run(run()) == 2


def _fill_proto(shape, values=(0.5,)):
    proto = protocol.TensorProto(dtype=protocol.DATA_TYPE.values_by_name["DT_FLOAT"].number)
    for size in shape:
        proto.tensor_shape.dim.add().size = size
    proto.float_val.extend(values)
    return proto


@pytest.mark.parametrize("shape", [(-1, 8, 8, 1), (-4, 8, 8, -1), (1 << 40, 8, 8, 1), (1 << 62, 1 << 62, 8, 1)])
def test_absurd_dims_are_invalid(shape):
    with pytest.raises(InvalidRequestError, match="invalid dim"):
        from_tensor_proto(_fill_proto(shape, [0.5] * 64), "image")


def test_fill_expansion_is_bounded_before_allocating():
    proto = _fill_proto((400000, 8, 8, 1))
    assert proto.ByteSize() < 64
    with pytest.raises(ResourceExhaustedError, match="above the limit of 1048576 bytes"):
        from_tensor_proto(proto, "image", max_bytes=1 << 20)
    assert from_tensor_proto(_fill_proto((4, 8, 8, 1)), "image", max_bytes=1 << 20).shape == (4, 8, 8, 1)


def test_tensor_content_must_be_whole_items_and_model_name_required():
    proto = to_tensor_proto(np.zeros((4, 8, 8, 1), np.float32))
    proto.tensor_content = proto.tensor_content[:-1]
    with pytest.raises(InvalidRequestError, match="not a multiple of the float32 item size 4"):
        from_tensor_proto(proto, "image")
    for request in (protocol.PredictRequest(), protocol.GetModelMetadataRequest(metadata_field=["signature_def"])):
        with pytest.raises(InvalidRequestError, match="model_spec.name is required"):
            (converters.predict_request if isinstance(request, protocol.PredictRequest)
             else converters.metadata_request)(request)


@pytest.fixture(scope="module")
def hardened(repository, tmp_path_factory):
    """tflite server with batching (queue capacity 8 rows, no splitting limit), auth, repository poll."""
    root = tmp_path_factory.mktemp("hardened")
    _copy(repository, root, 1)
    params = root / "batching.txt"
    params.write_text("max_batch_size { value: 4 }\nbatch_timeout_micros { value: 1000 }\n"
                      "max_enqueued_batches { value: 2 }\n")
    env = {**os.environ, "TFSHIP_TEST_TOKENS": TOKEN, "TFSHIP_TEST_ADMIN": ADMIN_TOKEN}
    with ServerProcess(root, MODEL, backend="tflite", env=env,
                       extra_args=("--batching-parameters-file", str(params), "--auth-token-env",
                                   "TFSHIP_TEST_TOKENS", "--admin-token-env", "TFSHIP_TEST_ADMIN", "--max-message-bytes", str(1 << 20),
                                   "--file-system-poll-wait-seconds", "0")) as server:
        yield server, root


def _x(rows: int) -> dict[str, np.ndarray]:
    return {"image": np.zeros((rows, 8, 8, 1), np.float32)}


def _code(fn) -> tuple[str, str]:
    with pytest.raises(RemoteError) as err:
        fn()
    return err.value.grpc_code, err.value.details


def test_grpc_malformed_requests(hardened, server):
    hard, root = hardened
    with PredictClient(hard.grpc_target, token=TOKEN) as client:
        request = protocol.PredictRequest()
        request.model_spec.name = MODEL
        request.inputs["image"].CopyFrom(_fill_proto((400000, 8, 8, 1)))
        assert _code(lambda: client.call(protocol.PREDICTION_SERVICE, "Predict", request))[0] == "RESOURCE_EXHAUSTED"
        code, details = _code(lambda: client.predict(MODEL, _x(9)))
        assert code == "INVALID_ARGUMENT" and "per-request limit of 8 rows" in details
        assert client.predict(MODEL, _x(8))["class_id"].shape == (8,)  # split into two batches
        code, details = _code(lambda: client.predict(MODEL, _x(1), output_filter=["logits", "logits"]))
        assert code == "INVALID_ARGUMENT" and "twice" in details
        for call in (lambda: client.model_status(""), lambda: client.metadata(""),
                     lambda: client.predict("", _x(1), convert_dtypes=False)):
            assert _code(call)[0] == "INVALID_ARGUMENT"
        code, details = _code(lambda: client.health("nosuch.Service"))
        assert code == "NOT_FOUND" and "'nosuch.Service'" in details and MODEL in details
        raw = client._channel.unary_unary(f"/{protocol.PREDICTION_SERVICE}/Predict")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff\x0f garbage", timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        bad = text_format.Parse(_entry("/nonexistent/x"), protocol.ModelServerConfig())
        code, details = _code(lambda: client.reload_config(bad))
        assert code == "PERMISSION_DENIED" and "admin token" in details  # an inference token may not reload
        with PredictClient(hard.grpc_target, token=ADMIN_TOKEN) as admin:
            code, details = _code(lambda: admin.reload_config(bad))
        assert code == "INVALID_ARGUMENT" and "/nonexistent/x" in details
        assert client.predict(MODEL, _x(1))["class_id"].shape == (1,)  # old config still serving
    for target, token in ((hard.grpc_target, TOKEN), (server.grpc_target, None)):  # batching on and off agree
        with PredictClient(target, token=token) as client:
            code, details = _code(lambda: client.predict(MODEL, _x(0)))
            assert code == "INVALID_ARGUMENT" and "0 rows" in details


def _rest(server, body: bytes, token: str | None = TOKEN, bearer: bool = True) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}" if bearer else token} if token else {}
    request = urllib.request.Request(f"{server.rest_url}/v1/models/{MODEL}:predict", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["error"]


def test_rest_malformed_bodies(hardened):
    hard, _ = hardened
    row = np.zeros((1, 8, 8, 1)).tolist()

    def post(**body):
        return _rest(hard, json.dumps(body).encode())

    assert post(instances=row, signature_name=["a"]) == (
        400, "JSON Value: [\"a\"] not formatted correctly. 'signature_name' key must be a string value.")
    assert post(instances=row, signature_name={"a": 1})[0] == 400
    assert post(instances=row, output_filter=5) == (400, "'output_filter' must be a list of output names, got 5")
    status, text = post(instances=row, output_filter="logits")
    assert status == 200 and len(json.loads(text)["predictions"][0]) == 10  # logits only, not split into letters
    status, text = post(inputs={"images": row})
    # TF Serving reads `inputs` by the signature's names (json_tensor.cc FillTensorMapFromInputsMap): the unknown
    # key is ignored and named in our hint, the missing one refused in its words
    assert status == 400 and "Missing named input: image in 'inputs' object." in text and "['images']" in text
    assert "image: float32[?,8,8,1]" in text
    status, text = _rest(hard, b'{"instances": ' + b"[" * 100000 + b"]" * 100000 + b"}")
    assert status == 400 and "nested too deeply" in text
    assert _rest(hard, json.dumps({"instances": row}).encode(), bearer=False)[0] == 401


def test_serve_flag_errors_exit_2_naming_the_flag(repository, capsys):
    base = ["serve", "--repository", str(repository), "--model-name", MODEL, "--rest-port", "-1", "--port", "0"]
    cases = {
        ("--port", "99999"): "--port 99999",
        ("--max-message-bytes", "-1"): "--max-message-bytes -1",
        ("--worker-threads", "0"): "--worker-threads 0",
        ("--tls-cert", "/etc/passwd", "--tls-key", "/etc/passwd"): "--tls-cert /etc/passwd is not a PEM file",
        ("--model-name", "nosuch"): f"{repository / 'nosuch'}' does not exist",
        ("--repository", "/nonexistent"): "'/nonexistent/digits' does not exist",
    }
    for flags, message in cases.items():
        assert cli.main([*base, *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags
