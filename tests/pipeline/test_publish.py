"""Atomic publishing into TF Serving's repository layout."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tfship.core.errors import StageError
from tfship.pipeline.orchestration.publish import existing_versions, publish_version


def test_versions_increase_and_manifest_hashes_every_file(exported, tmp_path):
    folder, _, _ = exported
    candidate = tmp_path / "candidate"
    shutil.copytree(folder, candidate)
    repository = tmp_path / "models"
    first = publish_version(candidate, repository, "digits", {"note": "first"})
    second = publish_version(candidate, repository, "digits", {"note": "second"})
    assert (first.version, second.version) == (1, 2)
    assert existing_versions(repository / "digits") == [1, 2]
    assert not [p for p in (repository / "digits").iterdir() if p.name.startswith(".")]
    manifest = json.loads((second.version_dir / "manifest.json").read_text())
    assert manifest["version"] == 2 and manifest["model_name"] == "digits" and manifest["note"] == "second"
    for entry in manifest["files"]:
        data = (second.version_dir / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["size_bytes"]
    assert (second.version_dir / "saved_model.pb").is_file()


def test_incomplete_candidate_publishes_nothing(tmp_path):
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "model.onnx").write_bytes(b"not a saved model")
    with pytest.raises(StageError, match="no saved_model.pb"):
        publish_version(candidate, tmp_path / "models", "digits", {})
    assert existing_versions(tmp_path / "models" / "digits") == []
