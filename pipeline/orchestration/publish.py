"""Publish stage: manifest, warm-up records and an atomic move into the model repository.

The repository follows TensorFlow Serving's layout, `<repository>/<model_name>/<version>/`, with
`saved_model.pb` at the version's root, so TF Serving loads a published folder unchanged. The
version folder is assembled under a hidden staging name in `<repository>/<model_name>/` (same
filesystem; TF Serving ignores non-numeric names) and renamed into place, so a reader never sees
a half-written version.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.errors import StageError
from tfship.core.files import write_npz
from tfship.core.locations import BucketUrl, Location
from tfship.core.manifest import MANIFEST_FILE, VersionManifest
from tfship.core.processes import pid_alive
from tfship.pipeline.orchestration.bucket_publish import publish_to_bucket
from tfship.pipeline.orchestration.outcomes import ArtifactOutcome
from tfship.serving.storage.signed import SIGNATURE_FILE, SignatureError, sign_version

GOLDEN_FILE = Path("assets.extra") / "tfship_golden.npz"
LIBRARIES = ("tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime", "ai-edge-litert", "tensorflow-serving-api",
             "grpcio", "numpy", "scikit-learn", "tfship")


@dataclass(frozen=True)
class PublishResult:
    """Where the version landed, its manifest, and every artifact's outcome (published or left out, and why:
    `pipeline.orchestration.outcomes.artifact_outcomes`, computed once by the publish stage; empty for a version
    published by `publish_version` alone).
    """

    version: int
    version_dir: Location  # a folder, or the version's s3:// prefix
    manifest: VersionManifest
    outcomes: tuple[ArtifactOutcome, ...] = ()


def existing_versions(model_root: Path) -> list[int]:
    """Numeric version folders under `<repository>/<model_name>/`, ascending."""
    if not model_root.is_dir():
        return []
    return sorted(int(p.name) for p in model_root.iterdir()
                  if p.is_dir() and p.name.isascii() and p.name.isdigit() and int(p.name) > 0)  # "²" is no version


def next_version(model_root: Path) -> int:
    """One more than the highest existing version (1 for a new model)."""
    versions = existing_versions(model_root)
    return versions[-1] + 1 if versions else 1


def write_golden_set(version_dir: Path, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> Path:
    """Save held-out inputs and the SavedModel's outputs (`input:<name>`, `output:<name>` keys)."""
    path = version_dir / GOLDEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"input:{k}": v for k, v in inputs.items()} | {f"output:{k}": v for k, v in outputs.items()}
    write_npz(path, arrays)
    return path


def read_golden_set(version_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inverse of `write_golden_set`: (inputs by name, expected outputs by name)."""
    with np.load(version_dir / GOLDEN_FILE) as data:
        inputs = {k.split(":", 1)[1]: data[k] for k in data.files if k.startswith("input:")}
        outputs = {k.split(":", 1)[1]: data[k] for k in data.files if k.startswith("output:")}
    return inputs, outputs


def file_inventory(version_dir: Path) -> list[dict[str, Any]]:
    """sha256 and size (bytes) of every file below `version_dir`, sorted by relative path."""
    rows = []
    for path in sorted(p for p in version_dir.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        rows.append({"path": str(path.relative_to(version_dir)), "sha256": digest.hexdigest(),
                     "size_bytes": path.stat().st_size})
    return rows


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries an artifact depends on."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit(folder: Path) -> str:
    """The commit of the checkout holding `folder` (`unknown` outside git); `+dirty` if modified."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


STALE_LEGACY_STAGING_S = 600  # a `.staging-<hex>` folder (no pid in its name) this old is a killed publish's


def remove_stale_staging(model_root: Path) -> list[Path]:
    """Delete `.staging-*` folders left by a killed publish: their publisher's pid is gone (or, for names
    without a pid, the folder is older than `STALE_LEGACY_STAGING_S`). A live publisher's folder is kept.
    Returns what was removed.
    """
    removed = []
    for path in model_root.glob(".staging-*"):
        pid = path.name.split("-")[1] if path.name.count("-") >= 2 else ""
        try:
            stale = (not pid_alive(int(pid))) if pid.isdigit() else \
                time.time() - path.stat().st_mtime > STALE_LEGACY_STAGING_S
        except OSError:
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed



def publish_version(candidate_dir: Path, repository: Location, model_name: str,
                    manifest: VersionManifest | Mapping[str, Any], signing_key: Path | None = None) -> PublishResult:
    """Copy a checked candidate version folder into the repository under the next version number.

    Args:
        candidate_dir: a complete version folder (SavedModel at its root, other artifacts beside it).
        repository: a folder (renamed into place) or an s3:// prefix (`bucket_publish.publish_to_bucket`).
        manifest: the version's manifest but `model_name`, `version`, `published_at` and `files`, which are
            filled in here (a mapping is read as a `VersionManifest`'s fields).
        signing_key: a PEM EC private key (`publish.signing_key`): the version gets `model.sig`, signing every
            file, the manifest (model name, version) among them, before it appears (`serving.storage.signed`).

    Raises:
        StageError: when the candidate has no `saved_model.pb`, the copy or the signing fails (no version
            appears).
        ManifestError: `manifest` is a mapping with a field of the wrong type (naming it).
    """
    if not (candidate_dir / "saved_model.pb").is_file():
        raise StageError(f"publish: {candidate_dir} holds no saved_model.pb; nothing was published")
    draft = manifest if isinstance(manifest, VersionManifest) else \
        VersionManifest.from_json({"files": [], **manifest}, "publish_version(manifest=...)")
    if isinstance(repository, BucketUrl):  # uploaded in checked steps, manifest last (bucket_publish)
        final = draft.with_files(file_inventory(candidate_dir)).stamped(published_at=_now())
        version, url, final = publish_to_bucket(candidate_dir, repository, model_name, final, signing_key)
        return PublishResult(version, url, final)
    model_root = Path(repository) / model_name
    model_root.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(model_root)
    staging = model_root / f".staging-{os.getpid()}-{secrets.token_hex(4)}"  # the pid tells a live publish
    try:
        shutil.copytree(candidate_dir, staging)
        (staging / MANIFEST_FILE).unlink(missing_ok=True)
        (staging / SIGNATURE_FILE).unlink(missing_ok=True)
        listed = draft.with_files(file_inventory(staging))
        for _attempt in range(5):
            version = next_version(model_root)
            final = listed.stamped(model_name=model_name, version=version, published_at=_now())
            final.write(staging)
            if signing_key is not None:
                _sign(staging, signing_key)
            target = model_root / str(version)
            if target.exists():
                continue  # another publisher took this number meanwhile; try the next one
            os.rename(staging, target)
            return PublishResult(version, target.resolve(), final)
        raise StageError(f"publish: could not claim a free version number under {model_root}")
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _sign(version_dir: Path, signing_key: Path) -> None:
    """`model.sig` over `version_dir`; raises StageError naming why it could not be signed."""
    try:
        sign_version(version_dir, signing_key)
    except SignatureError as err:
        raise StageError(f"publish: {err}; nothing was published") from err


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
