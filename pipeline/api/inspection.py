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
from tfship.tflite.inspect import describe_tflite


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
    if path.suffix == ".tflite" and path.is_file():
        info = describe_tflite(path)
        info["signatures"] = {
            key: {kind: [{"name": name, "dtype": t["dtype"], "shape": t["shape_signature"],
                          "quantization": t["quantization"]} for name, t in signature[kind].items()]
                  for kind in ("inputs", "outputs")}
            for key, signature in info["signatures"].items()}
        return {"format": "tflite"} | info
    if path.suffix == ".onnx" and path.is_file():
        import onnx  # the pipeline extra's, not in the TensorFlow-free install

        model = onnx.load(str(path), load_external_data=False)

        def spec(value) -> dict[str, Any]:
            tensor = value.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
            return {"name": value.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
                    "shape": dims}

        return {"format": "onnx", "path": str(path),
                "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
                "signatures": {"serving_default": {"inputs": [spec(v) for v in model.graph.input],
                                                   "outputs": [spec(v) for v in model.graph.output]}}}
    raise ConfigError(f"inspect: {path} is not a SavedModel folder, a .tflite or an .onnx file")


def inspect(path: Path | str) -> Inspection:
    """The signatures of a SavedModel folder, a `.tflite` or an `.onnx` (a model folder: its newest version).

    Raises:
        ConfigError: the path does not exist or is no SavedModel, .tflite or .onnx.
    """
    return Inspection(describe(Path(path)))
