"""The pipeline's one config format: TOML, validated by pydantic, overridable from the CLI.

Every section refuses unknown keys; errors name the file, the dotted key, the value received
and what is allowed (`ConfigError`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline.errors import ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "digits.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RunSection(_Section):
    """Run identity and folders."""

    model_name: str = Field("digits", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                            description="Model name in the repository (<repository>/<model_name>/<version>).")
    runs_dir: Path = Field(Path("runs"), description="Folder holding one subfolder per run.")
    seed: int = Field(42, ge=0, description="Seed for splits, shuffling and weight initialisation.")


class DataSection(_Section):
    """Where the data comes from and how it is split and batched."""

    source: Literal["digits"] = Field("digits", description="Dataset source; `digits` is scikit-learn's bundled set.")
    validation_fraction: float = Field(0.15, gt=0.0, lt=0.5, description="Share of samples for validation.")
    test_fraction: float = Field(0.2, gt=0.0, lt=0.5, description="Share of samples held out for test.")
    batch_size: int = Field(64, ge=1, le=65536, description="Training batch size (samples).")
    shuffle_buffer: int = Field(2048, ge=1, description="tf.data shuffle buffer (samples).")


class ModelSection(_Section):
    """Built-in model architecture."""

    kind: Literal["cnn"] = Field("cnn", description="Built-in model family.")
    filters: tuple[int, ...] = Field((16, 32), min_length=1, max_length=4, description="Conv filters per block.")
    dense_units: int = Field(64, ge=1, description="Width of the hidden dense layer.")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="Dropout rate before the classifier.")


class TrainSection(_Section):
    """The custom training loop."""

    epochs: int = Field(15, ge=1, le=10000, description="Passes over the training split.")
    learning_rate: float = Field(3e-3, gt=0.0, le=10.0, description="Adam learning rate.")
    clip_global_norm: float | None = Field(5.0, gt=0.0, description="Clip gradients to this global norm; none: off.")
    jit_compile: bool = Field(True, description="Compile the train step with XLA (tf.function(jit_compile=True)).")


class ExportSection(_Section):
    """SavedModel export: extra signatures beside `serving_default` (which always exists)."""

    extra_signatures: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="Signature name -> output names it returns (a subset of the "
        "contract's outputs), e.g. {predict_proba = [\"probabilities\"]}.")
    behaviour_checks: bool = Field(True, description="Run the behavioural checks (determinism, batch "
                                   "independence, no state change) on the reloaded SavedModel.")


class ConvertSection(_Section):
    """Artifact conversion."""

    onnx_opset: int = Field(17, ge=13, le=21, description="ONNX opset passed to tf2onnx (pinned default 17).")
    onnx_simplify: bool = Field(False, description="Run onnxslim on the ONNX file, then re-check it (needs the "
                                "`onnxslim` package; the parity gate judges the simplified file).")
    tflite_modes: tuple[Literal["float32", "float16", "dynamic_range", "int8"], ...] = Field(
        ("float32",), min_length=1, description="TFLite variants to produce.")
    representative_samples: int = Field(200, ge=1, description="Calibration samples for int8 (representative_dataset).")
    timeout_seconds: float = Field(300.0, gt=0.0, description="Per-conversion time limit, seconds.")


class ValidateSection(_Section):
    """Parity gate between artifacts and the SavedModel."""

    atol: float = Field(1e-5, ge=0.0, description="Absolute tolerance for float32 artifacts.")
    rtol: float = Field(1e-5, ge=0.0, description="Relative tolerance for float32 artifacts.")
    max_accuracy_drop_points: float = Field(0.5, ge=0.0,
                                            description="Allowed accuracy loss of float artifacts, percentage points.")
    float16_tolerance: float = Field(1e-2, gt=0.0, description="atol and rtol for float16 TFLite (scaled to range).")
    quantized_max_accuracy_drop_points: float = Field(
        1.0, ge=0.0, description="Allowed accuracy loss of dynamic-range and int8 artifacts, percentage points.")
    batch_sizes: tuple[int, ...] = Field((1, 7, 64), min_length=1, description="Batch sizes each artifact is run at.")
    task: Literal["auto", "classification", "regression"] = Field(
        "auto", description="Task metric for quantized artifacts: auto picks from the labels' dtype "
        "(integer: classification accuracy; float: regression MAE).")
    prediction_output: str | None = Field(None, description="Output the task metric scores; none: picked "
                                          "from the contract (first index output, else first score output).")
    regression_max_error_increase: float = Field(
        0.02, ge=0.0, description="Allowed MAE increase of quantized artifacts, as a fraction of the labels' "
        "standard deviation (regression tasks).")

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 for size in value):
            raise ValueError("every batch size must be >= 1")
        return value


class PublishSection(_Section):
    """Model repository (TF Serving layout)."""

    repository: Path = Field(Path("models"), description="Base path: <repository>/<model_name>/<version>/.")


class PipelineConfig(_Section):
    """The whole pipeline config, one section per stage family."""

    run: RunSection = RunSection()
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    export: ExportSection = ExportSection()
    convert: ConvertSection = ConvertSection()
    parity: ValidateSection = Field(ValidateSection(), alias="validate",
                                    description="The [validate] table: parity gate settings.")
    publish: PublishSection = PublishSection()


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    allowed = error.get("ctx", {}).get("expected")
    detail = f" (allowed: {allowed})" if allowed and str(allowed) not in error["msg"] else ""
    return f"key '{key}': {error['msg']}{detail}; got {error.get('input')!r}"


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a CLI override `section.key=value`; the value is read as TOML, else as a string.

    Raises:
        ConfigError: when the text has no `=`.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value, e.g. train.epochs=3")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def load_config(path: Path | str | None = None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read and validate a TOML config, then apply dotted-key overrides (CLI flags).

    Args:
        path: TOML file; None reads the bundled `configs/digits.toml`.
        overrides: {"train.epochs": 1, ...} applied after the file.

    Raises:
        ConfigError: unreadable file, bad TOML, unknown keys or invalid values, naming the file,
            key, value and what is allowed.
    """
    source = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        tree = tomllib.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ConfigError(f"{source}: config file not found") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source}: not valid TOML: {err}") from err
    for dotted, value in (overrides or {}).items():
        _set_dotted(tree, dotted, value)
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as err:
        problems = "; ".join(_describe(item) for item in err.errors())
        raise ConfigError(f"{source}: {problems}") from err
