"""`serve --artifact NAME`: a version `tfship run` published, served by the artifact's name from its manifest.

The server must answer with exactly the file the gate published under that name (LiteRT's own answer for
`model_int8.tflite`, not `model.tflite`'s), within the tolerance the manifest records for it against the
SavedModel; and refuse, before it loads anything (exit 2, naming the flag, the artifact and what is published),
a name the manifest leaves out, does not list, or whose file differs from what it published.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.published_tolerance import check_published_parity
from tfship.core.errors import ConfigError
from tfship.pipeline.orchestration.publish import read_golden_set
from tfship.serving.launcher import ServerProcess
from tfship.serving.runtimes import REGISTRY, RuntimeOptions
from tfship.serving.runtimes.published import ArtifactNotPublishedError
from tfship.serving.tfs.client import PredictClient

pytestmark = pytest.mark.slow

MODEL = "digits"


@pytest.fixture(scope="module")
def version(pipeline_run) -> Path:
    versions = sorted((pipeline_run["repository"] / MODEL).iterdir(), key=lambda p: int(p.name))
    return versions[-1]


@pytest.fixture(scope="module")
def manifest(version: Path) -> dict:
    return json.loads((version / "manifest.json").read_text())


def _litert(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The .tflite file's own answer through LiteRT's interpreter (no tfship code in between)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
    return runner(**inputs)


def _saved_model(version: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tensorflow as tf

    fn = tf.saved_model.load(str(version)).signatures["serving_default"]
    return {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in inputs.items()}).items()}


def test_serves_the_int8_file_the_gate_published(version: Path, manifest: dict) -> None:
    row = next(r for r in manifest["artifacts"] if r["artifact"] == "tflite_int8")
    assert row["status"] == "published" and row["file"] == "model_int8.tflite"
    inputs, _ = read_golden_set(version)
    with ServerProcess(version.parent.parent, MODEL, extra_args=("--artifact", "tflite_int8",
                                                                 "--metrics-port", "-1")) as server:
        with PredictClient(server.grpc_target, timeout_s=30) as client:
            got = client.predict(MODEL, inputs)
        with urllib.request.urlopen(f"{server.rest_url}/v1/models/{MODEL}/metadata", timeout=30) as answer:
            metadata = json.loads(answer.read())
        log = server.stderr_tail(200)
    assert server.returncode == 0
    assert "serving artifact tflite_int8 (model_int8.tflite" in log and "tflite backend" in log, log
    published = next(f for f in manifest["files"] if f["path"] == "model_int8.tflite")
    assert metadata["artifact"] == {"name": "tflite_int8", "backend": "tflite", "file": "model_int8.tflite",
                                    "sha256": published["sha256"]}  # the metadata names the file that answers

    own = _litert(version / "model_int8.tflite", inputs)
    for name, value in own.items():  # exactly the int8 file's answer ...
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    float32 = _litert(version / "model.tflite", inputs)
    assert not np.array_equal(got["logits"], float32["logits"]), "answered by model.tflite, not the int8 file"

    reference = _saved_model(version, inputs)  # ... within what the gate published for it against the SavedModel
    assert check_published_parity(got, reference, manifest, "tflite_int8") == 2  # logits, probabilities
    shifted = {**got, "logits": got["logits"] + 3.0}  # the check can fail: beyond atol 0.1 * 21.9 everywhere
    with pytest.raises(AssertionError, match=r"tflite_int8 logits: \d+ elements beyond atol 0.1\*"):
        check_published_parity(shifted, reference, manifest, "tflite_int8")
    np.testing.assert_array_equal(got["class_id"], np.argmax(got["logits"], axis=-1))


def _copy(version: Path, tmp_path: Path) -> Path:
    target = tmp_path / "repo" / MODEL / version.name
    shutil.copytree(version, target)
    return target


def _leave_out(copy: Path, artifact: str, reason: str) -> None:
    """What the publish stage writes for an artifact the gate left out: the row says why, its file is gone."""
    manifest = json.loads((copy / "manifest.json").read_text())
    row = next(r for r in manifest["artifacts"] if r["artifact"] == artifact)
    row.update(status="left out", stage="validate", reason=reason)
    manifest["files"] = [f for f in manifest["files"] if f["path"] != row["file"]]
    (copy / row["file"]).unlink()
    (copy / "manifest.json").write_text(json.dumps(manifest))


def _serve(repository: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tfship.serving", "serve", "--repository", str(repository), "--model-name",
               MODEL, "--port", "0", "--rest-port", "-1", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_refuses_an_artifact_the_gate_left_out(version: Path, tmp_path: Path) -> None:
    copy = _copy(version, tmp_path)
    _leave_out(copy, "tflite_float16", "output 'logits' max error 0.3 outside atol 0.01*21.9")
    done = _serve(copy.parent.parent, "--artifact", "tflite_float16")
    assert done.returncode == 2, done.stderr
    assert "ArtifactNotPublishedError: --artifact tflite_float16:" in done.stderr
    assert "lists it as 'left out' (validate: output 'logits' max error 0.3" in done.stderr
    assert "published there: ['onnx', 'saved_model', 'tflite_dynamic_range', 'tflite_float32', 'tflite_int8']" \
        in done.stderr
    assert "Traceback" not in done.stderr
    # the same version serves what it did publish (the refusal is about the name, not the version)
    assert REGISTRY.resolve_artifact("auto", copy, "tflite_int8").file == "model_int8.tflite"


@pytest.mark.parametrize(("flags", "message"), [
    (("--artifact", "tfjs"), "--artifact tfjs: {manifest} does not list it; published there: ["),
    (("--artifact", "tflite_int8", "--backend", "onnx"),
     "--artifact tflite_int8 is model_int8.tflite, served by the tflite backend; --backend onnx contradicts it"),
    (("--artifact", "tflite_int8", "--tflite-file", "model_float16.tflite"), "both choose the file to serve"),
])
def test_refuses_flags_that_name_no_published_file(version: Path, tmp_path: Path, flags, message) -> None:
    copy = _copy(version, tmp_path)
    done = _serve(copy.parent.parent, *flags)
    assert done.returncode == 2, done.stderr
    assert message.format(manifest=copy / "manifest.json") in done.stderr


def test_refuses_a_file_that_is_not_the_one_published(version: Path, tmp_path: Path) -> None:
    copy = _copy(version, tmp_path)
    shutil.copyfile(copy / "model.tflite", copy / "model_int8.tflite")  # another file under the published name
    with pytest.raises(ArtifactNotPublishedError, match=r"model_int8.tflite has \d+ bytes; the manifest published"):
        REGISTRY.create("auto", copy, RuntimeOptions(artifact="tflite_int8"))
    data = bytearray((version / "model_int8.tflite").read_bytes())
    data[-1] ^= 0xFF  # same size, one bit pattern changed
    (copy / "model_int8.tflite").write_bytes(bytes(data))
    with pytest.raises(ArtifactNotPublishedError, match="is not the file the manifest published"):
        REGISTRY.create("auto", copy, RuntimeOptions(artifact="tflite_int8"))
    (copy / "manifest.json").unlink()
    with pytest.raises(ConfigError, match="has no manifest.json"):
        REGISTRY.create("auto", copy, RuntimeOptions(artifact="tflite_int8"))

