"""Artifacts: what the convert stage produces beside the SavedModel, and how the gate runs each one.

Every artifact format (ONNX, the four TFLite modes, the three TF.js modes, and any format registered later) is
one `core.formats.ArtifactFormat` exported by its own package (`onnx_format/`, `tflite/`, `tfjs/`) and collected
by the conversion registry (`pipeline.conversion.registry`): its name, the file it writes into the version folder,
the tolerance family the parity gate judges it by, the `[convert]` key that enables it, the function that
converts the SavedModel into it, and how it is run. This module re-exports the registry's functions under the
names the stages use (`artifact_kinds`, `enabled_kinds`, `check_required`, ...).

The parity gate runs every artifact through the serving runtime registry (`serving.runtimes.REGISTRY`),
the same code that serves it, fed the way the server feeds it (string tensors as object arrays of
UTF-8 bytes, as decoded from TF Serving's `string_val`), with the runtime options its format names (TFLite:
which file). A format with no serving backend gives its own `runner` factory (and is not served by serve-check).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.formats import Artifact, ArtifactFormat, ConversionJob, Runner, ToleranceFamily, VariantOutcome
from tfship.core.statuses import ConversionStatus as ConversionStatus  # re-exported (outcomes imports it here)
from tfship.pipeline.conversion.registry import (
    ARTIFACT_KINDS,
    SAVED_MODEL,
    artifact_kinds,
    check_required,
    enabled_kinds,
    format_for,
    known_artifact_names,
    register_format,
)

ArtifactKind = ArtifactFormat  # the name the stages use for a registered format
register_artifact_kind = register_format


@dataclass(frozen=True)
class SignatureCarriage:
    """Which signatures of the SavedModel one artifact carries, and why it does not carry the others.

    files: {signature: the file in the version folder that answers it} (e.g. `{"serving_default": "model.onnx",
    "score": "model.score.onnx"}`); left_out: {signature: why this artifact does not carry it}.
    `name in carriage` asks whether it carries signature `name`.
    """

    files: dict[str, str]
    left_out: dict[str, str] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.files


def as_text(value: np.ndarray) -> np.ndarray:
    """Bytes / object / unicode arrays as a numpy unicode array (UTF-8 decoded); other arrays unchanged."""
    value = np.asarray(value)
    if value.dtype.kind not in "OSU":
        return value
    flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.ravel()]
    return np.array(flat, dtype=str).reshape(value.shape)


def _wire_form(value: np.ndarray) -> np.ndarray:
    """String tensors as the server hands them to a runtime: object arrays of UTF-8 bytes."""
    value = np.asarray(value)
    if value.dtype.kind not in "OSU":
        return value
    flat = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in value.ravel()]
    return np.array(flat, dtype=object).reshape(value.shape)


_ALLOWED_OPS: list[tuple[str, ...]] = [()]  # the op policy's allowance of the run in progress (`allowing_ops`)


@contextmanager
def allowing_ops(ops: tuple[str, ...]) -> Iterator[None]:
    """While a run executes, every runner it opens allows `ops` (`export.allow_ops`): the serving runtimes judge
    the SavedModel by the op policy at load, in the pipeline as in a server, with the same allowance.
    """
    _ALLOWED_OPS.append(tuple(ops))
    try:
        yield
    finally:
        _ALLOWED_OPS.pop()


class RuntimeRunner:
    """A loaded serving runtime as a runner: {input name: [N, ...]} -> {output name: [N, ...]}, through the
    signature `signature_name` (any signature the backend serves: a SavedModel's, a TFLite file's, an ONNX
    signature file's `model.<signature>.onnx`).

    Raises (on construction): `serving.runtimes.RuntimeLoadError` when the backend cannot load the file.
    """

    def __init__(self, artifact: Artifact, runtime_options: Mapping[str, Any] | None = None,
                 signature_name: str = "serving_default") -> None:
        from tfship.serving.runtimes import REGISTRY, RuntimeOptions

        self.signature_name = signature_name
        version_dir = artifact.path if artifact.path.is_dir() else artifact.path.parent
        options = {"allow_ops": _ALLOWED_OPS[-1], **(runtime_options or {})}
        # The option by which this backend is told which file to load (TFLite: `tflite_file`): this artifact's.
        spec = format_for(artifact)
        if spec is not None and spec.file_option:
            options[spec.file_option] = artifact.path.name
        self.runtime = REGISTRY.create(artifact.kind, version_dir, RuntimeOptions(**options))
        self.runtime.load()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.runtime.predict({name: _wire_form(value) for name, value in inputs.items()},
                                       self.signature_name)
        return {name: np.asarray(value) for name, value in outputs.items()}

    def close(self) -> None:
        """Unload the runtime."""
        self.runtime.unload()


def open_runner(artifact: Artifact) -> Runner:
    """The runner for `artifact`: its kind's own factory, else the serving runtime of its backend.

    Raises:
        TfshipError: the backend cannot load it (`RuntimeLoadError`).
    """
    spec = format_for(artifact)
    if spec is not None and spec.runner is not None:
        return spec.runner(artifact.path)
    return RuntimeRunner(artifact)


def saved_model_runner(path: Path, signature_name: str = "serving_default") -> Runner:
    """The SavedModel at `path` run as the gate runs its reference (the serving runtime), through its signature
    `signature_name`, string outputs as numpy unicode text (`as_text`).
    """
    artifact = Artifact(SAVED_MODEL, SAVED_MODEL, ToleranceFamily.FLOAT32, Path(path))
    runner = open_runner(artifact) if signature_name == "serving_default" else RuntimeRunner(
        artifact, signature_name=signature_name)
    return lambda inputs: {name: as_text(value) for name, value in runner(inputs).items()}


__all__ = ["ARTIFACT_KINDS", "SAVED_MODEL", "Artifact", "ArtifactKind", "ConversionJob", "ConversionStatus", "Runner",
           "RuntimeRunner", "SignatureCarriage", "VariantOutcome", "artifact_kinds", "as_text", "check_required",
           "enabled_kinds", "format_for", "known_artifact_names", "open_runner", "register_artifact_kind",
           "saved_model_runner"]
