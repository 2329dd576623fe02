"""Artifact kinds: what the convert stage produces beside the SavedModel, and how each is run and served.

An artifact kind is one registration (`register_artifact_kind`): its name, the file it writes into the
version folder, the tolerance family the parity gate judges it by, when the config enables it, the
function that converts the SavedModel into it, and how it is run. The built-in kinds (`onnx`,
`tflite_float32`, `tflite_float16`, `tflite_dynamic_range`, `tflite_int8`) are registered in
`pipeline/artifact_kinds.py`; a new kind (e.g. TF.js) is one more `register_artifact_kind(...)` call there.

The parity gate runs every artifact through the serving runtime registry (`serving.runtimes.REGISTRY`),
the same code that serves it, fed the way the server feeds it (string tensors as object arrays of
UTF-8 bytes, as decoded from TF Serving's `string_val`). A kind with no serving backend gives its own
`runner` factory (and is not served by serve-check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.errors import ConfigError
from tfship.core.statuses import ConversionStatus as ConversionStatus  # re-exported (outcomes imports it here)
from tfship.tflite.modes import TfliteMode

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
# An artifact's mode is one of the TFLite modes (`tflite.modes.TFLITE_MODES`): ONNX and TF.js map onto them.
FLOAT_MODES = (TfliteMode.FLOAT32.value, TfliteMode.FLOAT16.value)
QUANTIZED_MODES = (TfliteMode.DYNAMIC_RANGE.value, TfliteMode.INT8.value)


@dataclass(frozen=True)
class Artifact:
    """One servable file or folder.

    name: the artifact kind's name (`saved_model`, `onnx`, `tflite_int8`, ...); kind: its serving backend
    (`saved_model`, `onnx`, `tflite`); mode: the tolerance family (`float32`, `float16`,
    `dynamic_range`, `int8`); path: the file, or the SavedModel folder.
    """

    name: str
    kind: str
    mode: str
    path: Path

    def size_bytes(self) -> int:
        """Bytes on disk (a SavedModel: saved_model.pb plus variables/; another folder: every file in it)."""
        if self.path.is_file():
            return self.path.stat().st_size
        if not (self.path / "saved_model.pb").is_file():  # a folder artifact (TF.js: model.json + shards)
            return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        files = [self.path / "saved_model.pb", *sorted((self.path / "variables").glob("*"))]
        return sum(f.stat().st_size for f in files if f.is_file())


@dataclass(frozen=True)
class VariantOutcome:
    """One conversion's outcome: status `produced`, `refused` or `crashed`, with the reason.

    peak_memory_bytes: the largest peak resident memory of its converter children (0: unknown or none ran);
    predicted_peak_bytes: what the convert stage's memory budget planned for it
    (`pipeline.conversion.memory_budget`); signature_files: {other signature: its own file} for a kind that
    writes one file per signature (ONNX: `model.<signature>.onnx`); signatures_left_out: {signature of the
    SavedModel: why this artifact does not carry it} (e.g. int8 TFLite, calibrated on `serving_default` alone);
    warnings: what a static check found and left to the parity gate to decide (float16 TFLite: tensors above
    65504, named).
    """

    name: str
    status: str
    reason: str = ""
    path: str = ""
    size_bytes: int = 0
    seconds: float = 0.0
    reproduce_command: str = ""
    recipe: str = ""
    peak_memory_bytes: int = 0
    predicted_peak_bytes: int = 0
    signature_files: dict[str, str] = field(default_factory=dict)
    signatures_left_out: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class ConversionJob:
    """What every converter gets.

    version_dir: the folder holding the exported SavedModel (artifacts are written beside it);
    contract: its `serving_default` contract; settings: the `[convert]` section; calibration:
    {input name: [N, ...]} from the training split (int8's `representative_dataset`); sample: one real
    input batch each artifact is run on once before it counts; tflite_sources: the TFLite recipes'
    sources the export stage wrote (`{"unrolled": SavedModel folder or None, "unrolled_reason": str}`).
    """

    version_dir: Path
    contract: Any
    settings: Any
    calibration: dict[str, np.ndarray]
    sample: dict[str, np.ndarray]
    tflite_sources: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ArtifactKind:
    """One kind of converted artifact (see the module docstring).

    Attributes:
        name: artifact name used in reports, `convert.required` and the manifest (e.g. `tflite_int8`).
        backend: the serving runtime that runs it (`serving.runtimes.REGISTRY` name), or "" when none.
        mode: tolerance family judged by the parity gate (`float32`, `float16`, `dynamic_range`, `int8`).
        filename: the file (or folder) it writes into the version folder.
        companions: other files that belong to it, by name or glob pattern (e.g. `model.onnx.data`, ONNX
            external weights; `model.*.onnx`, ONNX's other signatures' files).
        enabled: whether the `[convert]` section asks for it.
        convert: converts `job.version_dir`'s SavedModel into `job.version_dir / filename`.
        runtime_options: `serving.runtimes.RuntimeOptions` fields that select this file.
        serve_flags: `tfship serve` flags that serve this file (serve-check), e.g. `--tflite-file`.
        runner: a runner factory for kinds without a serving backend (path -> Runner).
    """

    name: str
    backend: str
    mode: str
    filename: str
    enabled: Callable[[Any], bool]
    convert: Callable[[ConversionJob], VariantOutcome]
    runtime_options: Mapping[str, Any] = field(default_factory=dict)
    serve_flags: tuple[str, ...] = ()
    runner: Callable[[Path], Runner] | None = None
    companions: tuple[str, ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        """Every file name it occupies in the version folder."""
        return (self.filename, *self.companions)

    def artifact(self, version_dir: Path) -> Artifact:
        """This kind's artifact inside `version_dir`."""
        return Artifact(self.name, self.backend, self.mode, Path(version_dir) / self.filename)


SAVED_MODEL = "saved_model"
ARTIFACT_KINDS: dict[str, ArtifactKind] = {}


def register_artifact_kind(kind: ArtifactKind) -> ArtifactKind:
    """Add an artifact kind; a name registered twice, or the reserved `saved_model`, is refused.

    Raises:
        ConfigError: the name is taken.
    """
    if kind.name in ARTIFACT_KINDS or kind.name == SAVED_MODEL:
        raise ConfigError(f"artifact kind {kind.name!r} is already registered")
    ARTIFACT_KINDS[kind.name] = kind
    return kind


def artifact_kinds() -> dict[str, ArtifactKind]:
    """Every registered kind by name (the built-ins register when `pipeline.conversion` is imported)."""
    return ARTIFACT_KINDS


def check_required(settings) -> None:
    """Refuse a `convert.required` entry that names no registered kind, or a kind the config does not enable.

    Raises:
        ConfigError: naming the key, the value and the known artifacts.
    """
    for name in settings.required:
        if name == SAVED_MODEL:
            continue
        if name not in ARTIFACT_KINDS:
            raise ConfigError(f"key 'convert.required': unknown artifact {name!r}; known: "
                              f"{[SAVED_MODEL, *ARTIFACT_KINDS]}")
        if not ARTIFACT_KINDS[name].enabled(settings):
            raise ConfigError(f"key 'convert.required': artifact {name!r} is required but not enabled "
                              "(see convert.tflite_modes)")


def enabled_kinds(settings) -> list[ArtifactKind]:
    """The kinds the `[convert]` section asks for, in registration order."""
    return [kind for kind in artifact_kinds().values() if kind.enabled(settings)]


def known_artifact_names() -> tuple[str, ...]:
    """`saved_model` and every registered kind's name (what `convert.required` may list)."""
    return (SAVED_MODEL, *artifact_kinds())


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
        options = dict(runtime_options or {})
        if artifact.kind == "tflite":
            options["tflite_file"] = artifact.path.name
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
    kind = artifact_kinds().get(artifact.name)
    if kind is not None and kind.runner is not None:
        return kind.runner(artifact.path)
    return RuntimeRunner(artifact, kind.runtime_options if kind else None)


def saved_model_runner(path: Path, signature_name: str = "serving_default") -> Runner:
    """The SavedModel at `path` run as the gate runs its reference (the serving runtime), through its signature
    `signature_name`, string outputs as numpy unicode text (`as_text`).
    """
    artifact = Artifact(SAVED_MODEL, "saved_model", "float32", Path(path))
    runner = open_runner(artifact) if signature_name == "serving_default" else RuntimeRunner(
        artifact, signature_name=signature_name)
    return lambda inputs: {name: as_text(value) for name, value in runner(inputs).items()}
