"""`tfship.inspect(path)` and `tfship inspect PATH`: the signatures of a SavedModel, a `.tflite` or an `.onnx`, like
`saved_model_cli show` (names, dtypes, shapes with -1 for dynamic dimensions); for a published version,
also its status and every artifact's outcome (published, or left out and why) from `manifest.json`.
`inspect` returns an `Inspection` (tables in a notebook and a terminal); `describe` the same as JSON-ready values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfship.core.errors import ConfigError
from tfship.core.manifest import MANIFEST_FILE, ManifestError, VersionManifest
from tfship.core.saved_model import read_signatures
from tfship.pipeline.api.results import Inspection
from tfship.pipeline.conversion.registry import artifact_kinds


def _resolve(path: Path) -> Path:
    """A model folder `<repository>/<name>` resolves to its highest numeric version."""
    if path.is_dir() and not (path / "saved_model.pb").exists():
        versions = sorted((int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit()))
        if versions:
            return path / str(versions[-1])
    return path


def _outcomes(version_dir: Path) -> dict[str, Any]:
    """A published version's status and per-artifact outcomes from its `manifest.json` ({} without one)."""
    if not (version_dir / MANIFEST_FILE).is_file():
        return {}
    try:
        manifest = VersionManifest.read(version_dir)
    except ManifestError as err:
        raise ConfigError(f"inspect: {err}") from err
    return {"status": manifest.status, "artifacts": [row.model_dump(mode="json") for row in manifest.artifacts]}


def describe(path: Path) -> dict[str, Any]:
    """Describe an artifact's signatures: {"format", "path", "signatures": {name: {"inputs", "outputs"}}}.

    Raises:
        ConfigError: the path does not exist or is no SavedModel, .tflite or .onnx.
    """
    path = _resolve(Path(path))
    if (path / "saved_model.pb").is_file():
        contracts = read_signatures(path)
        return {"format": "saved_model", "path": str(path),
                "signatures": {k: c.to_json() for k, c in contracts.items()}} | _outcomes(path)
    described = next((spec.describe for spec in artifact_kinds().values()
                      if spec.describe is not None and spec.suffix and path.suffix == spec.suffix), None)
    if described is not None and path.is_file():
        return described(path)
    raise ConfigError(f"inspect: {path} is not a SavedModel folder, a .tflite or an .onnx file")


def inspect(path: Path | str) -> Inspection:
    """The signatures of a SavedModel folder, a `.tflite` or an `.onnx` (a model folder: its newest version).

    Raises:
        ConfigError: the path does not exist or is no SavedModel, .tflite or .onnx.
    """
    return Inspection(describe(Path(path)))
