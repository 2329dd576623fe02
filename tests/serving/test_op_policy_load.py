"""The op policy (`core.op_policy`) at load: a real server refuses a version whose SavedModel touches the host, from
a local repository, on hot reload and from a bucket (versions tfship did not publish), with a one-line reason in
the model status and the log, and keeps serving its other versions and models. Nothing the refused graphs hold
runs: not at load, not their warm-up records (no marker file appears). Errors raised inside a model answer with
their own code, as TF Serving answers them (NotFound: NOT_FOUND / 404, OutOfRange: OUT_OF_RANGE / 400)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.op_policy_models import REFUSED_OP, save_module
from tests.s3_server import bucket, s3_endpoint, s3_env  # noqa: F401  (the S3 server's fixtures)
from tfship.serving.dataplane.types import VersionState
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient, RemoteError

X = np.ones((2, 4), np.float32)
REFUSED_MODELS = ("read", "match", "print_file", "init_write")


def _save_out_of_range(folder: Path) -> Path:
    """`y = x @ w + next(iter(range(sum(x))))`: an empty range (x all zero) raises OutOfRangeError in the model."""
    import tensorflow as tf

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones((4, 2)))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            first = next(iter(tf.data.Dataset.range(tf.cast(tf.reduce_sum(x), tf.int64))))
            return {"y": x @ self.w + tf.cast(first, tf.float32)}

    model = Model()
    tf.saved_model.save(model, str(folder), signatures={"serving_default": model.serve})
    return folder


def _write_warmup(version_dir: Path) -> None:
    """One warm-up record feeding `x` (TF Serving's format): a refused version must not replay it."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = "serving_default"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(X))
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
    (version_dir / "assets.extra").mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(version_dir / "assets.extra" / "tf_serving_warmup_requests")) as writer:
        writer.write(log.SerializeToString())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("op_policy_load")
    marker = root / "marker"
    folders = {kind: save_module(kind, root / "corpus" / kind, marker)
               for kind in ("plain", "write", *REFUSED_MODELS)}
    for kind in ("plain", "write", "print_file", "init_write"):  # the models taking `x`
        _write_warmup(folders[kind])
    folders["out_of_range"] = _save_out_of_range(root / "corpus" / "out_of_range")
    return root, folders, marker


def _config(repository: Path, names) -> Path:
    """Every version of each model served (a refused version 2 beside a good version 1)."""
    path = repository / "models.config"
    path.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{repository / name}" model_platform: "tensorflow" '
        'model_version_policy { all {} } }\n' for name in names) + "}\n")
    return path


def _wait_for(client: PredictClient, model: str, want: dict[int, VersionState], timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = {s.version: s for s in client.model_status(model)}
        if all(v in statuses and statuses[v].state is state for v, state in want.items()):
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"{model}: wanted {want}, have {statuses}")
        time.sleep(0.2)


def test_refused_at_load_and_on_hot_reload_while_the_rest_serves(corpus, tmp_path):
    _, folders, marker = corpus
    repository = tmp_path / "repo"
    shutil.copytree(folders["plain"], repository / "evil" / "1")
    shutil.copytree(folders["out_of_range"], repository / "out_of_range" / "1")
    for kind in REFUSED_MODELS:
        shutil.copytree(folders["plain"], repository / kind / "1")
        shutil.copytree(folders[kind], repository / kind / "2")
    config = _config(repository, ("evil", "out_of_range", *REFUSED_MODELS))
    with ServerProcess(repository, "evil", extra_args=("--model-config-file", str(config),
                                                       "--file-system-poll-wait-seconds", "0.2")) as server, \
            PredictClient(server.grpc_target, timeout_s=30) as client:
        for kind in REFUSED_MODELS:
            status = _wait_for(client, kind, {2: VersionState.END, 1: VersionState.AVAILABLE})[2]
            message = status.error_message
            assert status.error_code == "FAILED_PRECONDITION" and "\n" not in message, message
            assert "refused by the op policy" in message and f"op {REFUSED_OP[kind]} (" in message, message
            assert "function __inference_" in message and "--allow-ops" in message, message
            assert message.startswith(f"{repository / kind / '2'}: refused by the op policy"), message
            if kind in ("read", "match"):
                with pytest.raises(RemoteError) as err:
                    client.predict(kind, {"path": np.array(b"/etc/passwd")}, version=2)
                assert err.value.grpc_code in ("NOT_FOUND", "UNAVAILABLE", "FAILED_PRECONDITION"), err.value
            assert client.predict(kind, {"x": X})["y"].shape == (2, 2)  # its version 1 serves
        answer = requests.post(f"{server.rest_url}/v1/models/read/versions/2:predict",
                               json={"inputs": {"path": "/etc/passwd"}}, timeout=30)
        assert answer.status_code != 200 and "root:" not in answer.text
        served = client.predict("evil", {"x": X})["y"]

        # hot reload: a new version that writes a file (and carries warm-up records) is refused, v1 keeps serving
        staging = repository / "evil" / ".staging-2"
        shutil.copytree(folders["write"], staging)
        staging.rename(repository / "evil" / "2")
        statuses = _wait_for(client, "evil", {2: VersionState.END, 1: VersionState.AVAILABLE})
        assert "op WriteFile (" in statuses[2].error_message and "serving_default" in statuses[2].error_message
        np.testing.assert_array_equal(client.predict("evil", {"x": X})["y"], served)

        # an error raised inside the model answers its own code, and serving goes on
        with pytest.raises(RemoteError) as err:
            client.predict("out_of_range", {"x": np.zeros((1, 4), np.float32)})
        assert err.value.grpc_code == "OUT_OF_RANGE" and "End of sequence" in err.value.details, err.value.details
        rest = requests.post(f"{server.rest_url}/v1/models/out_of_range:predict", json={"instances": [[0, 0, 0, 0]]},
                             timeout=30)
        assert rest.status_code == 400 and "OutOfRangeError" in rest.json()["error"], rest.text
        assert client.predict("out_of_range", {"x": X})["y"].shape == (2, 2)
        log = server.stderr_tail(400)
    assert "failed to load read version 2" in log and "op ReadFile (" in log
    assert not marker.exists()  # no refused graph ran: not at load, not its warm-up records


def test_allowed_by_name_and_not_found_inside_the_model_is_not_found(corpus, tmp_path):
    _, folders, _ = corpus
    repository = tmp_path / "repo"
    shutil.copytree(folders["read"], repository / "read" / "1")
    readable = tmp_path / "readable.txt"
    readable.write_text("the operator allowed this")
    with ServerProcess(repository, "read", extra_args=("--allow-ops", "ReadFile",
                                                       "--file-system-poll-wait-seconds", "0")) as server, \
            PredictClient(server.grpc_target, timeout_s=30) as client:
        assert client.predict("read", {"path": np.array(str(readable).encode())})["y"] == b"the operator allowed this"
        with pytest.raises(RemoteError) as err:
            client.predict("read", {"path": np.array(b"/nonexistent/missing.txt")})
        assert err.value.grpc_code == "NOT_FOUND" and "NotFoundError" in err.value.details, err.value.details
        assert len(err.value.details) < 2048 and "Traceback" not in err.value.details
        rest = requests.post(f"{server.rest_url}/v1/models/read:predict",
                             json={"inputs": {"path": "/nonexistent/missing.txt"}}, timeout=30)
        assert rest.status_code == 404 and "missing.txt" in rest.json()["error"], rest.text
        assert client.predict("read", {"path": np.array(str(readable).encode())})["y"] == b"the operator allowed this"


def test_refused_from_a_bucket(corpus, bucket, s3_env, tmp_path):  # noqa: F811 (fixtures)
    from tfship.core.locations import BucketUrl
    from tfship.pipeline.orchestration.publish import publish_version

    _, folders, marker = corpus
    repository = BucketUrl(f"s3://{bucket}/models")
    assert publish_version(folders["plain"], repository, "evil", {"status": "test"}).version == 1
    assert publish_version(folders["write"], repository, "evil", {"status": "not by tfship's gate"}).version == 2
    with ServerProcess(repository, "evil", env={**s3_env, "TFSHIP_MODEL_CACHE_DIR": str(tmp_path / "cache")}, extra_args=(
            "--file-system-poll-wait-seconds", "0",
            "--model-config-file", str(_bucket_config(tmp_path, repository)))) as server, \
            PredictClient(server.grpc_target, timeout_s=30) as client:
        statuses = _wait_for(client, "evil", {1: VersionState.AVAILABLE, 2: VersionState.END})
        assert "refused by the op policy" in statuses[2].error_message and "op WriteFile (" in statuses[2].error_message
        assert client.predict("evil", {"x": X})["y"].shape == (2, 2)
    assert not marker.exists()


def _bucket_config(tmp_path: Path, repository) -> Path:
    path = tmp_path / "bucket.config"
    path.write_text(f'model_config_list {{ config {{ name: "evil" base_path: "{repository}/evil" '
                    'model_platform: "tensorflow" model_version_policy { all {} } } }\n')
    return path

