"""The published `manifest.json` is one typed contract (`core.manifest.VersionManifest`): one writer, one reader.

Checked here: a round trip through the file; a manifest written the old way (a dict, before artifact rows had a
backend, family, signatures, size and sha256; and the first format, with no artifacts at all) still reads, in the
pipeline and in the server; a corrupt one is refused naming the file and the field; the publisher and the bucket
mirror read through the same reader (a real fsspec filesystem, the in-memory one), and no other module parses
a manifest.json itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import fsspec
import pytest

from tfship.core.locations import BucketUrl
from tfship.core.manifest import MANIFEST_FILE, ManifestError, VersionManifest
from tfship.pipeline.orchestration.publish import publish_version
from tfship.serving.runtimes.published import ArtifactNotPublishedError, resolve_artifact
from tfship.serving.storage.mirror import BucketMirror

ROOT = Path(__file__).resolve().parents[2]
SHA = hashlib.sha256(b"tflite bytes").hexdigest()


class _TfliteRuntime:
    artifact_files = ("*.tflite",)


def _old_manifest(version_dir: Path) -> dict:
    """A manifest exactly as `tfship run` wrote it before the typed record: artifact rows are outcomes only."""
    (version_dir / "model_int8.tflite").write_bytes(b"tflite bytes")
    (version_dir / "saved_model.pb").write_bytes(b"pb")
    return {
        "status": "partial",
        "artifacts": [
            {"artifact": "saved_model", "status": "published", "stage": "", "reason": "", "file": "saved_model.pb",
             "required": True, "reason_file": ""},
            {"artifact": "tflite_int8", "status": "published", "stage": "", "reason": "",
             "file": "model_int8.tflite", "required": False, "reason_file": ""},
            {"artifact": "onnx", "status": "left out", "stage": "validate", "reason": "logits: 0.3 > 1e-4",
             "file": "model.onnx", "required": False, "reason_file": "reasons/onnx.txt"}],
        "run": "/runs/digits-1", "git_commit": "abc", "signature_def": {}, "signatures": {},
        "class_names": ["0", "1"], "data": {}, "metrics": {"test_accuracy": 0.9}, "parity": {}, "audit": {},
        "serve_check": {}, "conversions": [], "libraries": {"tensorflow": "2.x"},
        "model_name": "digits", "version": 4, "published_at": "2026-12-01T10:00:00+00:00",
        "files": [{"path": "model_int8.tflite", "sha256": SHA, "size_bytes": 12},
                  {"path": "saved_model.pb", "sha256": hashlib.sha256(b"pb").hexdigest(), "size_bytes": 2}],
    }


def test_round_trip_through_the_file_keeps_every_field(tmp_path):
    old = _old_manifest(tmp_path)
    manifest = VersionManifest.from_json(old | {"added_by_a_newer_tfship": {"x": 1}})
    manifest.write(tmp_path)
    again = VersionManifest.read(tmp_path)
    assert again == manifest and again.to_json() == manifest.to_json()
    assert again.to_json()["added_by_a_newer_tfship"] == {"x": 1}  # unknown keys survive a read and a write
    assert VersionManifest.from_json(manifest.to_bytes(), "bytes") == manifest
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # written atomically


def test_a_manifest_written_the_old_way_still_reads_everywhere(tmp_path):
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(_old_manifest(tmp_path), indent=2))
    manifest = VersionManifest.read(tmp_path)
    int8 = manifest.artifact("tflite_int8")
    assert (int8.size_bytes, int8.sha256) == (12, SHA)  # taken from its files row
    assert (int8.backend, int8.family, int8.signatures) == ("", "", ())  # not recorded then
    assert manifest.published_names() == ["saved_model", "tflite_int8"] and manifest.version == 4
    assert manifest.artifact("onnx").reason == "logits: 0.3 > 1e-4"
    served = resolve_artifact(tmp_path, "tflite_int8", {"tflite": _TfliteRuntime})  # the server's reader
    assert (served.file, served.backend, served.sha256) == ("model_int8.tflite", "tflite", SHA)
    with pytest.raises(ArtifactNotPublishedError, match="lists it as 'left out' \\(validate: logits"):
        resolve_artifact(tmp_path, "onnx", {"tflite": _TfliteRuntime})
    first_format = {"model_name": "digits", "version": 1, "published_at": "2026-11-01T00:00:00+00:00",
                    "files": _old_manifest(tmp_path)["files"], "metrics": {}, "class_names": []}
    assert VersionManifest.from_json(first_format).artifacts == ()  # before artifacts were listed


@pytest.mark.parametrize(("change", "field"), [
    (lambda m: m.pop("files"), "'files'"),
    (lambda m: m["artifacts"][1].update(status="maybe"), "'artifacts.1.status'"),
    (lambda m: m["artifacts"][2].pop("artifact"), "'artifacts.2.artifact'"),
    (lambda m: m["files"][0].update(size_bytes="12"), "'files.0.size_bytes'"),
    (lambda m: m["files"][0].update(sha256="0" * 63), "'files.0.sha256'"),
    (lambda m: m["files"][1].update(path="../../etc/passwd"), "'files.1.path'"),
    (lambda m: m.update(version="4"), "'version'"),
    (lambda m: m["artifacts"][1].update(sha256="0" * 64, size_bytes=12), "artifacts.1: tflite_int8's size/sha256"),
])
def test_a_corrupt_manifest_is_refused_naming_the_file_and_the_field(tmp_path, change, field):
    payload = _old_manifest(tmp_path)
    change(payload)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(payload))
    with pytest.raises(ManifestError) as refused:
        VersionManifest.read(tmp_path)
    assert str(tmp_path / MANIFEST_FILE) in str(refused.value) and field in str(refused.value)
    with pytest.raises(ArtifactNotPublishedError, match=re.escape(field)):  # the server refuses it the same way
        resolve_artifact(tmp_path, "tflite_int8", {"tflite": _TfliteRuntime})


def test_unreadable_or_missing_manifests_are_refused_naming_the_file(tmp_path):
    with pytest.raises(ManifestError, match=re.escape(f"{tmp_path / MANIFEST_FILE} does not exist")):
        VersionManifest.read(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text('{"files": [')
    with pytest.raises(ManifestError, match=re.escape(f"{tmp_path / MANIFEST_FILE}: not valid JSON")):
        VersionManifest.read(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text("[]")
    with pytest.raises(ManifestError, match="a manifest is a JSON object, got list"):
        VersionManifest.read(tmp_path)


def test_publish_writes_and_the_bucket_mirror_reads_through_the_same_record(tmp_path, caplog):
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    payload = _old_manifest(candidate)
    draft = VersionManifest.from_json({k: v for k, v in payload.items() if k not in ("version", "files")} | {
        "files": []})
    published = publish_version(candidate, tmp_path / "models", "digits", draft)
    local = VersionManifest.read(published.version_dir)
    assert local == published.manifest and local.version == 1 and local.model_name == "digits"
    int8 = local.artifact("tflite_int8")
    assert (int8.size_bytes, int8.sha256) == (12, SHA)  # filled in from the version's files by the publisher
    assert {row.path for row in local.files} == {"model_int8.tflite", "saved_model.pb"}

    fs = fsspec.filesystem("memory")
    url = BucketUrl(f"s3://rec-test-{tmp_path.name}/models/digits")
    base = f"{url.bucket}/{url.key}"
    for path in published.version_dir.iterdir():
        fs.pipe_file(f"{base}/1/{path.name}", path.read_bytes())
    broken = local.to_json() | {"files": [dict(row, size_bytes=-1) for row in local.to_json()["files"]]}
    fs.pipe_file(f"{base}/2/model_int8.tflite", b"tflite bytes")
    fs.pipe_file(f"{base}/2/{MANIFEST_FILE}", json.dumps(broken).encode())
    mirror = BucketMirror(url, tmp_path / "cache", filesystem=fs)
    with caplog.at_level(logging.ERROR, logger="tfship.serving.storage.mirror"):
        found = mirror.complete_versions()
    assert sorted(found) == [1] and found[1].manifest == local  # the same typed record, read by the same reader
    assert f"{url}/2/{MANIFEST_FILE}: field 'files.0.size_bytes'" in caplog.text
    served_root = mirror.sync(lambda versions: versions[-1:])
    assert VersionManifest.read(served_root / "1") == local


PARSERS = re.compile(r"json\.loads?\(|orjson\.loads\(")
NOT_THE_PUBLISHED_MANIFEST = {  # files whose `manifest` is another document, with why
    "bench/train/recommender.py": "the synthetic recommender data's shard list (pipeline.data.recommender_data)",
    "bench/train/loop_runs.py": "the synthetic recommender data's shard list (pipeline.data.recommender_data)",
}


def test_no_module_but_the_record_parses_a_manifest_json_itself():
    offenders = []
    for folder in ("core", "pipeline", "serving", "signatures", "tflite", "tfjs", "deploy", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == "core/manifest.py" or relative in NOT_THE_PUBLISHED_MANIFEST:
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines):
                nearby = " ".join(lines[max(0, number - 3):number + 1])
                if PARSERS.search(line) and re.search(r"[Mm]anifest|MANIFEST|\bMARKER\b", nearby):
                    offenders.append(f"{relative}:{number + 1}: {line.strip()}")
    assert offenders == [], "parse manifest.json with core.manifest.VersionManifest:\n" + "\n".join(offenders)


def test_the_grep_finds_a_manifest_parsed_by_hand(tmp_path):
    """The check above can fail: the pattern it looks for matches the code it forbids."""
    line = 'manifest = json.loads((version_dir / "manifest.json").read_text())'
    assert PARSERS.search(line) and re.search(r"manifest", line)
