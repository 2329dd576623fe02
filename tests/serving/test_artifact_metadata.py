"""Metadata names the published artifact that answers under `tfship serve --artifact NAME`, in keys TF Serving's
and the Open Inference Protocol's clients do not read: `artifact` beside `model_spec` / `metadata` in REST
`/v1/models/M/metadata`, and `parameters` in V2 model metadata. Without `--artifact`, both answers keep exactly
their protocol's keys. A real server on free ports, a real ONNX version with the manifest the publish stage writes.
"""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shadow_models

from tfship.pipeline.orchestration.publish import file_inventory
from tfship.serving.launcher import ServerProcess

MODEL = "lin"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """`<repo>/lin/1/model.onnx` with a manifest publishing it as artifact `onnx` (files: size and sha256)."""
    root = tmp_path_factory.mktemp("artifact")
    version = shadow_models.write_onnx_version(root / MODEL / "1", *shadow_models.weights())
    (version / "manifest.json").unlink()
    manifest = {"model_name": MODEL, "version": 1,
                "artifacts": [{"artifact": "onnx", "status": "published", "file": "model.onnx"}],
                "files": file_inventory(version)}
    (version / "manifest.json").write_text(json.dumps(manifest))
    return root


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def test_metadata_names_the_artifact_that_answers(repo: Path) -> None:
    digest = hashlib.sha256((repo / MODEL / "1" / "model.onnx").read_bytes()).hexdigest()
    with ServerProcess(repo, MODEL, extra_args=("--artifact", "onnx", "--metrics-port", "-1")) as server:
        v1 = _get(f"{server.rest_url}/v1/models/{MODEL}/metadata")
        v2 = _get(f"{server.rest_url}/v2/models/{MODEL}")
    assert v1["artifact"] == {"name": "onnx", "backend": "onnx", "file": "model.onnx", "sha256": digest}
    assert v1["model_spec"]["version"] == "1" and "serving_default" in v1["metadata"]["signature_def"]["signature_def"]
    assert v2["parameters"] == {"artifact": "onnx", "artifact_backend": "onnx", "artifact_file": "model.onnx",
                                "artifact_sha256": digest}
    assert v2["platform"] == "onnxruntime_onnx" and v2["versions"] == ["1"]


def test_without_artifact_the_metadata_keeps_the_protocols_keys(repo: Path) -> None:
    with ServerProcess(repo, MODEL, extra_args=("--metrics-port", "-1")) as server:
        v1 = _get(f"{server.rest_url}/v1/models/{MODEL}/metadata")
        v2 = _get(f"{server.rest_url}/v2/models/{MODEL}")
    assert sorted(v1) == ["metadata", "model_spec"]  # TF Serving's GetModelMetadata JSON, nothing added
    assert sorted(v2) == ["inputs", "name", "outputs", "platform", "versions"]
