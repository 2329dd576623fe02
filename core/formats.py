"""The artifact format plug-in: what a converted format tells the pipeline about itself, in one record.

A format package (`tflite/`, `tfjs/`, `onnx_format/`) exports `FORMATS`, a tuple of `ArtifactFormat`s; the
conversion registry (`pipeline.conversion.registry`) collects them. Everything the pipeline knows about a format
is read from its `ArtifactFormat`: its name, the serving backend that runs it, the file(s) it writes, the
tolerance family the parity gate judges it by, the `[convert]` key that enables it, its converter, the model of
its converter's peak memory, and how its signatures map to files. Nothing above this floor branches on a
format's name.

This lives on the bottom floor (TF-free, numpy only) because the format packages sit on floor 3 and may not
import the pipeline above them; the pipeline re-exports `ConversionJob` and `VariantOutcome` from
`pipeline.conversion.artifacts`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.contract import DEFAULT_SIGNATURE

MIB = 2**20


class ToleranceFamily(enum.StrEnum):
    """The parity gate's tolerance families: one `[validate.<family>]` config table each.

    - `float32`: a float32 implementation of the same graph (ONNX, TFLite float32, TF.js float32).
    - `float16`: float16 weights (TFLite float16, TF.js float16).
    - `dynamic_range`: int8 (or uint8) weights, float activations (TFLite dynamic range, TF.js uint8).
    - `int8`: integer weights and activations (TFLite full int8).

    A `StrEnum`: members compare equal to, and serialise to JSON as, their words (`parity.json`'s `mode`).
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    DYNAMIC_RANGE = "dynamic_range"
    INT8 = "int8"

    @property
    def quantized(self) -> bool:
        """True for the families whose weights are integers (`dynamic_range`, `int8`)."""
        return self in (ToleranceFamily.DYNAMIC_RANGE, ToleranceFamily.INT8)


@dataclass(frozen=True)
class PeakModel:
    """Predicted peak resident bytes of one conversion's child processes: `base_bytes + per_weight_byte x weight
    bytes` of the SavedModel (fitted per format on measured peaks, docs/benchmarks.md).
    """

    base_bytes: int
    per_weight_byte: float

    def predict(self, weight_bytes: int) -> int:
        """Predicted peak resident bytes for a SavedModel holding `weight_bytes` of weights."""
        return int(self.base_bytes + self.per_weight_byte * weight_bytes)


DEFAULT_PEAK = PeakModel(1000 * MIB, 10.0)  # a format whose peak was never fitted (TF.js, a new format)


@dataclass(frozen=True)
class Artifact:
    """One servable file or folder of a version.

    name: the artifact's name (`saved_model`, `onnx`, `tflite_int8`, ...); kind: its serving backend
    (`saved_model`, `onnx`, `tflite`; "" when none serves it); mode: the tolerance family (`ToleranceFamily`);
    path: the file, or the folder (the SavedModel, a TF.js graph model).
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
    """One conversion's outcome: status `produced`, `refused` or `crashed` (`core.statuses.ConversionStatus`),
    with the reason.

    peak_memory_bytes: the largest peak resident memory of its converter children (0: unknown or none ran);
    predicted_peak_bytes: what the convert stage's memory budget planned for it
    (`pipeline.conversion.memory_budget`); signature_files: {other signature: its own file} for a format that
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
class ConversionJob:
    """What every converter gets.

    version_dir: the folder holding the exported SavedModel (artifacts are written beside it);
    contract: its `serving_default` contract (`core.contract.Signature`); settings: the `[convert]` section;
    calibration: {input name: [N, ...]} from the training split (int8's `representative_dataset`); sample: one
    real input batch each artifact is run on once before it counts; tflite_sources: the TFLite recipes'
    sources the export stage wrote (`{"unrolled": SavedModel folder or None, "unrolled_reason": str}`).
    """

    version_dir: Path
    contract: Any
    settings: Any
    calibration: dict[str, np.ndarray]
    sample: dict[str, np.ndarray]
    tflite_sources: dict[str, Any] = field(default_factory=dict)


Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def one_signature(path: Path) -> dict[str, str]:
    """The signature map of a format whose one file (or folder) answers `serving_default` alone."""
    return {DEFAULT_SIGNATURE: Path(path).name}


@dataclass(frozen=True)
class ArtifactFormat:
    """One artifact format (a plug-in: see the module docstring).

    Attributes:
        name: artifact name in reports, `convert.required` and the manifest (e.g. `tflite_int8`).
        package: the format package that converts it (`onnx`, `tflite`, `tfjs`): its conversions share a
            converter, so the memory budget refines their peaks together and the report compares sizes within it.
        backend: the serving runtime that runs it (`serving.runtimes.REGISTRY` name), or "" when none.
        family: the tolerance family the parity gate judges it by (`[validate.<family>]`).
        filename: the file (or folder) it writes into the version folder.
        enable_key: the `[convert]` field that enables it (`convert.<enable_key>`): a bool, or a list of modes
            holding `enable_value`.
        convert: converts `job.version_dir`'s SavedModel into `job.version_dir / filename`.
        peak: the model of its converter children's peak memory (`pipeline.conversion.memory_budget`).
        enable_value: the mode `convert.<enable_key>` must list; None when the key is a bool.
        companions: other files that belong to it, by name or glob pattern (e.g. `model.onnx.data`, ONNX
            external weights; `model.*.onnx`, ONNX's other signatures' files).
        file_option: the `serving.runtimes.RuntimeOptions` field by which its backend is told which file to load
            (TFLite: `tflite_file`); "" when the backend finds its file itself.
        serve_flags: `tfship serve` flags that serve this file (serve-check), e.g. `--tflite-file`.
        runner: a runner factory for formats without a serving backend (path -> Runner; TF.js in Node.js).
        signature_files: {signature: file name in the version folder} of a produced artifact at `path`; default:
            its one file answers `serving_default`.
        separate_signature_files: each signature other than `serving_default` is a file of its own (ONNX), run
            and set aside on its own by the gate.
        one_signature_reason: why it carries no other signature when its converter gave no reason.
        describe: `tfship inspect`'s description of a file with its file name's suffix (`format`, `path`,
            `signatures`: {name: {"inputs", "outputs"}}); None when `inspect` does not read this format.
        warm_child: its converter runs in its package's one warm child (`core.warm_children`), so the convert
            stage runs its package's conversions one at a time (`run_within_budget`'s `serial_families`).
    """

    name: str
    package: str
    backend: str
    family: ToleranceFamily
    filename: str
    enable_key: str
    convert: Callable[[ConversionJob], VariantOutcome]
    peak: PeakModel = DEFAULT_PEAK
    enable_value: str | None = None
    companions: tuple[str, ...] = ()
    file_option: str = ""
    serve_flags: tuple[str, ...] = ()
    runner: Callable[[Path], Runner] | None = None
    signature_files: Callable[[Path], dict[str, str]] = one_signature
    separate_signature_files: bool = False
    one_signature_reason: str = ""
    describe: Callable[[Path], dict[str, Any]] | None = None
    warm_child: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", ToleranceFamily(self.family))

    @property
    def mode(self) -> ToleranceFamily:
        """The tolerance family (the name the records use: `parity.json`'s `mode`)."""
        return self.family

    @property
    def runtime_options(self) -> dict[str, Any]:
        """`serving.runtimes.RuntimeOptions` fields that make its backend load this format's file."""
        return {self.file_option: self.filename} if self.file_option else {}

    @property
    def suffix(self) -> str:
        """The suffix of its file name (`.tflite`, `.onnx`; "" for a folder): what `tfship inspect` recognises."""
        return Path(self.filename).suffix

    @property
    def files(self) -> tuple[str, ...]:
        """Every file name (or glob pattern) it occupies in the version folder."""
        return (self.filename, *self.companions)

    @property
    def enable_setting(self) -> str:
        """The dotted config key that enables it, e.g. `convert.tflite_modes` (with `enable_value` listed)."""
        return f"convert.{self.enable_key}"

    def artifact(self, version_dir: Path) -> Artifact:
        """This format's artifact inside `version_dir`."""
        return Artifact(self.name, self.backend, self.family, Path(version_dir) / self.filename)

    def enabled(self, settings: Any) -> bool:
        """Whether the `[convert]` section `settings` asks for it (`convert.<enable_key>`).

        Raises:
            AttributeError: the section has no field `enable_key` (a format registered with a wrong key).
        """
        value = getattr(settings, self.enable_key)
        return bool(value) if self.enable_value is None else self.enable_value in value


__all__ = ["DEFAULT_PEAK", "MIB", "Artifact", "ArtifactFormat", "ConversionJob", "PeakModel", "Runner",
           "ToleranceFamily", "VariantOutcome", "one_signature"]
