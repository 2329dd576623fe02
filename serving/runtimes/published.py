"""`--artifact NAME`: serve the one file the gate published under that name, on the backend that runs it.

A version published by tfship holds several servable files and a `manifest.json`
(`pipeline.orchestration.publish`). Its `artifacts` rows give each artifact's outcome and file, e.g.
`{"artifact": "tflite_int8", "status": "published", "file": "model_int8.tflite", ...}`; its `files` rows give
every file's `sha256` and `size_bytes`. `resolve_artifact` reads both: the artifact must be listed as
`published`, its file must be the one the manifest lists (same size and sha256), and a registered backend must
declare that file name among its `Runtime.artifact_files` (`*.tflite` for `tflite`, `model.onnx` for `onnx`,
`saved_model.pb` for `saved_model`). Anything else is refused with an `ArtifactNotPublishedError` naming the
flag, the artifact, the manifest and what it lists as published: the server never falls back to another file.

`--backend` and `--tflite-file` keep their TF Serving meaning (operator's choice, no manifest needed);
`--artifact` is the manifest's choice, so it refuses either of them set to something else (`check_artifact_flags`).
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tfship.core.errors import ConfigError
from tfship.core.manifest import MANIFEST_FILE, ManifestError, VersionManifest

PUBLISHED = "published"  # `ArtifactOutcome.status` of an artifact that passed the gate
FLAG = "--artifact"


class ArtifactNotPublishedError(ConfigError):
    """`--artifact NAME` names no file the version's manifest lists as published (or the file differs from it)."""


@dataclass(frozen=True)
class PublishedArtifact:
    """One published artifact, resolved for serving.

    Attributes:
        name: the artifact's name in the manifest (`tflite_int8`, `onnx`, `saved_model`, ...).
        file: its file, relative to the version folder (`model_int8.tflite`).
        backend: the registered backend that serves it (`tflite`).
        sha256: the file's digest as the manifest lists it (hex); checked against the file on disk.
    """

    name: str
    file: str
    backend: str
    sha256: str


def read_manifest(version_dir: Path) -> VersionManifest:
    """The version's `manifest.json` (`core.manifest.VersionManifest.read`, the one reader).

    Raises:
        ArtifactNotPublishedError: no manifest (not a version published by tfship), or one the reader refuses
            (naming the file and field).
    """
    if not (Path(version_dir) / MANIFEST_FILE).exists():
        raise ArtifactNotPublishedError(
            f"{FLAG}: {version_dir} has no {MANIFEST_FILE}, so it names no published artifact (serve versions "
            "published by `tfship run`, or choose the file with --backend/--tflite-file)")
    try:
        return VersionManifest.read(Path(version_dir))
    except ManifestError as err:
        raise ArtifactNotPublishedError(f"{FLAG}: {err}") from err


def published_names(manifest: VersionManifest) -> list[str]:
    """The artifacts a manifest lists as published, sorted."""
    return manifest.published_names()


def resolve_artifact(version_dir: Path, name: str, backends: Mapping[str, type]) -> PublishedArtifact:
    """The file and backend of artifact `name` in `version_dir`, as its manifest publishes it.

    Args:
        version_dir: a version folder (`<repository>/<model>/<version>/`) holding `manifest.json`.
        name: the artifact, e.g. `tflite_int8`.
        backends: registered backend name -> `Runtime` class (each declares `artifact_files`, glob patterns),
            in the registry's order.

    Raises:
        ArtifactNotPublishedError: no manifest; `name` not listed, or listed as left out (the message gives the
            stage and reason the manifest records, and the published artifacts); its file missing, or not the
            size and sha256 the manifest lists; or no backend of this server serves that file name.
    """
    version_dir = Path(version_dir)
    manifest = read_manifest(version_dir)
    where = version_dir / MANIFEST_FILE
    published = published_names(manifest)
    row = manifest.artifact(name)
    if row is None or row.status != PUBLISHED:
        why = "does not list it" if row is None else f"lists it as {row.status!r} ({_why_left_out(row)})"
        raise ArtifactNotPublishedError(f"{FLAG} {name}: {where} {why}; published there: {published}")
    file = row.file
    listed = {f.path: {"size_bytes": f.size_bytes, "sha256": f.sha256} for f in manifest.files}
    path = version_dir / file
    if not file or Path(file).name != file or file not in listed:
        raise ArtifactNotPublishedError(f"{FLAG} {name}: {where} gives file {file!r}, which is not a file of the "
                                        "version it lists")
    _check_file(name, path, listed[file])
    backend = next((b for b, cls in backends.items()
                    if any(fnmatch.fnmatchcase(file, p) for p in getattr(cls, "artifact_files", ()))), None)
    if backend is None:
        raise ArtifactNotPublishedError(f"{FLAG} {name}: no backend of this server serves {file} (backends: "
                                        f"{sorted(backends)})")
    return PublishedArtifact(name, file, backend, str(listed[file]["sha256"]))


def _why_left_out(row) -> str:
    """`stage: reason` of a manifest row not published; the stage only where the manifest records one."""
    reason = row.reason or "no reason"
    return f"{row.stage}: {reason}" if row.stage else reason


def _check_file(name: str, path: Path, row: Mapping) -> None:
    """Refuse `path` unless its size and sha256 are the manifest's (the file the gate proved, not another)."""
    if not path.is_file():
        raise ArtifactNotPublishedError(f"{FLAG} {name}: the published file {path} is missing")
    size = path.stat().st_size
    if size != row.get("size_bytes"):
        raise ArtifactNotPublishedError(f"{FLAG} {name}: {path} has {size} bytes; the manifest published "
                                        f"{row.get('size_bytes')}")
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != row.get("sha256"):
        raise ArtifactNotPublishedError(f"{FLAG} {name}: {path} is not the file the manifest published (sha256 "
                                        f"{digest.hexdigest()[:16]}..., published {str(row.get('sha256'))[:16]}...)")


def check_artifact_flags(artifact: str | None, tflite_file: str, prefer_tflite_model: bool,
                         default_tflite_file: str = "model.tflite") -> None:
    """Refuse flags that would choose another file than `--artifact` does.

    Args:
        artifact: the `--artifact` value; None = not given (nothing to check).

    Raises:
        ConfigError: `--artifact` given empty (or blank); `--artifact` with `--tflite-file` other than its default,
            or with `--prefer_tflite_model`. (`--backend` other than `auto` is checked per version, against the
            backend the manifest implies.)
    """
    if artifact is None:
        return
    if not artifact.strip():
        raise ConfigError(f"{FLAG} {artifact!r}: empty; name a published artifact (e.g. tflite_int8, onnx), or "
                          f"leave {FLAG} out")
    if tflite_file != default_tflite_file:
        raise ConfigError(f"{FLAG} {artifact} and --tflite-file {tflite_file} both choose the file to serve; "
                          "give one (--artifact takes the file from the version's manifest)")
    if prefer_tflite_model:
        raise ConfigError(f"{FLAG} {artifact} and --prefer_tflite_model both choose the file to serve; give one")
