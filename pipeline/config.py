"""The pipeline's one config format: TOML, validated by pydantic, overridable from the CLI.

Every section refuses unknown keys; errors name the file, the dotted key, the value received
and what is allowed (`ConfigError`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from tfship.core.errors import ConfigError
from tfship.core.locations import BucketUrl, Location, pydantic_validator
from tfship.pipeline.config_section import LocalPath
from tfship.pipeline.config_section import Section as _Section
from tfship.pipeline.config_train import StepSection as StepSection  # re-exported
from tfship.pipeline.config_train import TrainSection
from tfship.pipeline.config_validate import TOP1_AGREEMENT_FLOORS as TOP1_AGREEMENT_FLOORS  # re-exported
from tfship.pipeline.config_validate import ValidateSection, refuse_moved_keys
from tfship.tflite.modes import TfliteModeName

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "digits.toml"
# A repository: a local folder or an s3:// bucket prefix (core.locations); other URL schemes refused.
RepositoryLocation = Annotated[Any, BeforeValidator(pydantic_validator("repository", buckets=True))]


class RunSection(_Section):
    """Run identity and folders."""

    model_name: str = Field(default="digits", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                            description="Model name in the repository (<repository>/<model_name>/<version>).")
    runs_dir: LocalPath = Field(default=Path("runs"), description="Folder holding one subfolder per run.")
    seed: int = Field(default=42, ge=0, description="Seed for splits, shuffling and weight initialisation.")


class FeatureSpecSection(_Section):
    """One tf.Example feature of a TFRecord source (`tf.io.FixedLenFeature(shape, dtype)`); a named model input
    (`pipeline.data.input_spec`).
    """

    dtype: Literal["float32", "int64", "string"] = Field(default="float32", description="Feature dtype in the "
                                                         "tf.Example.")
    shape: tuple[int, ...] = Field(default=(), description="Fixed feature shape per example; [] is a scalar.")
    kind: Literal["dense", "categorical", "sequence"] = Field(default="dense", description="Input kind "
                                                              "(training.input_specs).")
    vocabulary: tuple[str, ...] = Field(default=(), description="String values: the known ones (the model's "
                                        "StringLookup: id 1 + index, 0 unknown); empty: the values the scan finds.")
    num_ids: int | None = Field(default=None, ge=2, description="int64 ids lie in [0, num_ids) (embedding rows).")
    length: int | None = Field(default=None, ge=1, description="Sequence: padded (or cut) to this many ids.")
    ragged: bool = Field(default=False, description="Sequence: a ragged input of any length instead of padding.")
    input_name: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$", description="Model input "
                                   "name.")


class DataSection(_Section):
    """Where the data comes from and how it is split and batched (readers: `pipeline.data.sources`)."""

    source: Literal["digits", "csv", "npz", "image_folder", "tfrecord"] = Field(
        default="digits", description="Dataset source; `digits` is scikit-learn's bundled set (no download).")
    path: LocalPath | None = Field(default=None, description="CSV / NPZ / TFRecord file or image folder (not for "
                                   "digits).")
    features: tuple[str, ...] = Field(default=(), description="CSV feature columns, NPZ array or TFRecord feature "
                                      "names.")
    label: str = Field(default="label", min_length=1, description="CSV label column, NPZ label array or TFRecord "
                       "feature.")
    classes: tuple[str, ...] = Field(default=(), description="Declared class names (index = class id); empty: "
                                     "inferred.")
    categorical: dict[str, tuple[str, ...]] = Field(
        default={}, description="CSV categorical columns -> allowed values (one-hot; for tabular / recommender a "
        "string input with a StringLookup in the model); an empty list: the values the scan finds.")
    input_name: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$",
                                   description="Model input name; default per source (image, features, ...).")
    image_size: tuple[int, int] | None = Field(default=None, description="Image folder: resize to [height, width] "
                                               "pixels.")
    rescale: float = Field(default=1.0 / 255.0, gt=0.0, description="Image folder: pixel multiplier after decoding.")
    color_mode: Literal["grayscale", "rgb"] = Field(default="rgb", description="Image folder: channels to decode.")
    feature_spec: dict[str, FeatureSpecSection] = Field(default={}, description="TFRecord: tf.Example feature specs.")
    validation_fraction: float = Field(default=0.15, gt=0.0, lt=0.5, description="Share of samples for validation.")
    test_fraction: float = Field(default=0.2, gt=0.0, lt=0.5, description="Share of samples held out for test.")
    batch_size: int = Field(default=64, ge=1, le=65536, description="Training batch size (samples).")
    shuffle_buffer: int = Field(default=2048, ge=1, description="tf.data shuffle buffer (samples).")
    cache: bool = Field(default=True, description="Cache the decoded training split in memory (tf.data cache; "
                        "in-memory sources only: digits, npz).")
    train_path: LocalPath | None = Field(default=None, description="Streaming sources: the train files (a glob); with "
                                         "validation_path and test_path it replaces the hash split of `path`.")
    validation_path: LocalPath | None = Field(default=None, description="Streaming sources: the validation files (a "
                                              "glob).")
    test_path: LocalPath | None = Field(default=None, description="Streaming sources: the test files (a glob).")
    compression: Literal["auto", "none", "GZIP", "ZLIB"] = Field(
        default="auto", description="TFRecord compression; auto: GZIP for *.gz, ZLIB for *.zz / *.zlib, else none.")
    stream_cache: str = Field(default="none", description="Streaming sources: cache the train split's records after "
                              "the first epoch: none, memory, or a file path prefix (tf.data cache file).")
    sample_size: int = Field(default=2000, ge=1, description="Streaming sources: records of the test split the gate, "
                             "warm-up and `tfship query` use, and of the train split normalisation is adapted on.")
    split_key: str | None = Field(default=None, description="Streaming sources: hash this feature (TFRecord, a "
                                  "declared scalar) or column (CSV) for the split instead of the whole record, so "
                                  "records sharing a key (a user, a session) stay in one split.")
    skip_corrupt: bool = Field(default=False, description="Streaming sources: skip corrupt or malformed records and "
                               "count them (train.json `input.skipped_records`) instead of stopping with exit 2.")
    split_sizes: dict[Literal["train", "validation", "test"], Annotated[int, Field(ge=1)]] = Field(
        default={}, description="Streaming sources: records per split, declared ({train = N, validation = N, test = "
        "N}): no counted pass over the data (so data.classes and string vocabularies must be declared too).")

    @field_validator("split_sizes")
    @classmethod
    def _all_three_sizes(cls, value: dict) -> dict:
        if value and set(value) != {"train", "validation", "test"}:
            raise ValueError(f"declare train, validation and test together (got {sorted(value)})")
        return value


class ModelSection(_Section):
    """Built-in model architecture, or a user factory `module:function` returning a keras.Model."""

    kind: Literal["cnn", "mlp", "text", "tabular", "recommender"] = Field(
        default="cnn", description="Built-in model family; tabular and recommender take data.feature_spec's named "
        "inputs.")
    task: Literal["classification", "binary", "regression"] = Field(
        default="classification", description="Loss, head and judged metric (core.tasks): accuracy, AUC or MAE.")
    factory: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                                description="`module:function` called as f(input_shape=, num_classes=, **args) "
                                "for one input, f(specs=, task=, num_classes=, **args) for named inputs (task= "
                                "also for one input when the function accepts it).")
    factory_args: dict[str, Any] = Field(default={}, description="Keyword arguments passed to the factory.")
    filters: tuple[int, ...] = Field(default=(16, 32), min_length=1, max_length=4, description="Conv filters per "
                                     "block.")
    hidden_units: tuple[int, ...] = Field(default=(128, 64), min_length=1, description="MLP hidden layer widths.")
    dense_units: int = Field(default=64, ge=1, description="Width of the hidden dense layer (cnn, text).")
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0, description="Dropout rate before the classifier.")
    vocab_size: int = Field(default=10000, ge=2, description="Text: token ids in [0, vocab_size); 0 is padding.")
    embedding_dim: int = Field(default=32, ge=1, description="Text: embedding width.")
    pooling: Literal["mean", "max"] = Field(default="mean", description="Text: pooling over tokens.")
    normalize: bool = Field(default=False, description="Bake a Normalization layer, adapted on the train split, into "
                            "the model (cnn, mlp: the input; tabular, recommender: each dense input).")
    recompute: tuple[str, ...] = Field(default=(), description="Layer names recomputed in the backward pass "
                                       "(tf.recompute_grad).")


class ExportSection(_Section):
    """SavedModel export: extra signatures beside `serving_default` (which always exists)."""

    extra_signatures: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="Signature name -> output names it returns (a subset of the "
        "contract's outputs), e.g. {predict_proba = [\"probabilities\"]}.")
    behaviour_checks: bool = Field(default=True, description="Run the behavioural checks (determinism, batch "
                                   "independence, no state change) on the reloaded SavedModel.")
    batch_independence_tolerance: float = Field(
        default=1e-3, gt=0.0, lt=1.0, description="Behaviour check: how far a row run alone (batch 1) may differ from "
        "the same row in a batch of 8, as a fraction of max(1, max |output|) plus the same fraction of each value, on "
        "top of twice the float rounding the SavedModel shows between batches of 8 and 16 of the same rows. "
        "Batch statistics (BatchNormalization in training mode) move outputs far more than this.")
    allow_ops: tuple[str, ...] = Field(default=(), description="Op names the op policy allows although they touch the "
                                       "host (core.op_policy), e.g. [\"PrintV2\"]; recorded in audit.json and the "
                                       "manifest (`allowed_ops`). Empty: every host op is refused.")

    @field_validator("allow_ops")
    @classmethod
    def _op_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from tfship.core.op_policy import parse_op_list

        return parse_op_list(value)


class ConvertSection(_Section):
    """Artifact conversion."""

    onnx: bool = Field(default=True, description="Produce the ONNX file (model.onnx, tf2onnx; onnx_format/).")
    onnx_opset: int = Field(default=17, ge=13, le=21, description="ONNX opset passed to tf2onnx (pinned default 17).")
    onnx_simplify: bool = Field(default=False, description="Run onnxslim on the ONNX file, then re-check it (needs the "
                                "`onnxslim` package; the parity gate judges the simplified file).")
    tflite_modes: tuple[TfliteModeName, ...] = Field(
        default=("float32",), min_length=1, description="TFLite variants to produce.")
    representative_samples: int = Field(default=200, ge=1, description="Calibration samples for int8 "
                                        "(representative_dataset).")
    tfjs_modes: tuple[Literal["float32", "float16", "uint8"], ...] = Field(
        default=(), description="TF.js graph models to produce (tfjs/, tfjs_float16/, tfjs_uint8/; weights as float32, "
        "float16 or uint8), each proven in Node.js; empty: none (the converter needs .venv-tfjs and Node.js >= 20).")
    formats: tuple[str, ...] = Field(default=(), description="Further registered artifact formats to produce, by name: "
                                     "a format with no [convert] key of its own (a plug-in's; enable_key 'formats'). "
                                     "Names are checked against the registry (`pipeline.conversion.registry`).")
    timeout_seconds: float = Field(default=300.0, gt=0.0, description="Per-conversion time limit, seconds.")
    max_workers: int = Field(default=0, ge=0, description="Conversions that do not depend on each other run side by "
                             "side, each in its own child process with its time limit: at most this many at once; 0 = "
                             "the number of cores this process may run on. Within `convert.memory_budget_bytes` too.")
    memory_budget_bytes: int = Field(default=0, ge=0, description="Memory the convert stage's process tree may use, "
                                     "bytes: conversions run side by side only while their predicted peaks fit, the "
                                     "rest one after another (`pipeline.conversion.memory_budget`); 0 = "
                                     "`convert.memory_share` of the memory available when the stage starts.")
    memory_share: float = Field(default=0.25, gt=0.0, le=1.0, description="Share of the available memory "
                                "(MemAvailable) the convert stage plans for when `convert.memory_budget_bytes` is 0.")
    size_limit_bytes: int = Field(default=2**31 - 1, ge=1, description="Largest protobuf (ONNX) or FlatBuffer (TFLite) "
                                  "file, bytes (both formats stop at 2 GiB). A SavedModel whose weights exceed it is "
                                  "written to ONNX with external data (tf2onnx --large_model) and refused for TFLite "
                                  "by name.")
    allow_flex: bool = Field(default=False, description="TFLite: when builtins cannot express the graph (an "
                             "unsupported op, or a recurrent layer's tensor list ops), also try SELECT_TF_OPS (Flex) "
                             "and report the Flex ops the file needs. The bundled LiteRT (ai_edge_litert) has no Flex "
                             "delegate and cannot run such a file, so it is never kept: this only tells which ops are "
                             "missing. Recurrent layers go on to the `unrolled` recipe either way.")
    required: tuple[str, ...] = Field(
        default=(), description="Artifacts that must be published or the run fails (nothing published), e.g. "
        "[\"onnx\", \"tflite_float32\"]; the SavedModel always is. Any other artifact that fails is left out "
        "with its reason and the rest is published. Names are checked against the registered artifact kinds "
        "(`pipeline.conversion.artifacts.check_required`).")


class PublishSection(_Section):
    """Model repository (TF Serving layout)."""

    repository: RepositoryLocation = Field(default=Path("models"), description="Base path: <repository>/<model_name>/"
                                           "<version>/; a local folder or s3://BUCKET/PREFIX (docs/buckets.md).")

    signing_key: Path | None = Field(default=None, description="PEM EC private key: each published version is signed "
                                     "with it (model.sig over every file and the manifest's model name and version; "
                                     "docs/security.md, Signed versions). None: unsigned.")

    @field_validator("repository", mode="after")
    @classmethod
    def _location(cls, value: Any) -> Location:
        return value if isinstance(value, Path | BucketUrl) else Path(value)


class PipelineConfig(_Section):
    """The whole pipeline config, one section per stage family."""

    run: RunSection = RunSection()
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    export: ExportSection = ExportSection()
    convert: ConvertSection = ConvertSection()
    parity: ValidateSection = Field(default=ValidateSection(), alias="validate",
                                    description="The [validate] table: parity gate settings.")
    publish: PublishSection = PublishSection()


def _describe(error: ErrorDetails) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        known = _known_keys(error["loc"][:-1])
        return f"unknown key '{key}'" + (f" (known: {', '.join(known)})" if known else "")
    allowed = error.get("ctx", {}).get("expected")
    detail = f" (allowed: {allowed})" if allowed and str(allowed) not in error["msg"] else ""
    return f"key '{key}': {error['msg'].removeprefix('Value error, ')}{detail}; got {error.get('input')!r}"


def _known_keys(loc: tuple) -> list[str]:
    """The keys of the config table at `loc` (a validation error's location), [] when it is not a table."""
    model: Any = PipelineConfig
    for part in loc:
        fields = getattr(model, "model_fields", {})
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return sorted(f.alias or name for name, f in model.model_fields.items())


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


def load_config(path: Path | str | None = None, overrides: dict[str, Any] | None = None,
                origin: str = "--set") -> PipelineConfig:
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
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise ConfigError(f"{source}: cannot read the config file ({type(err).__name__}: {err})") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source}: not valid TOML: {err}") from err
    return _overridden(tree, overrides or {}, str(source), origin)


def with_overrides(config: PipelineConfig, overrides: dict[str, Any], source: str) -> PipelineConfig:
    """`config` with dotted-key `overrides` applied (`--set` on a run's stored config), validated again.

    Raises:
        ConfigError: an unknown key or invalid value, naming `source` (the stored config's file), key and value.
    """
    return _overridden(config.model_dump(mode="json", by_alias=True), overrides, source)


def _overridden(tree: dict[str, Any], overrides: dict[str, Any], source: str,
                origin: str = "--set") -> PipelineConfig:
    """`tree` (a config's sections) with dotted-key `overrides` set, validated; ConfigError names `source`, and
    `origin` (`--set` on the command line, `argument` from the Python API) with the override a problem came from.
    """
    for dotted, value in overrides.items():
        _set_dotted(tree, dotted, value)
    for dotted, value in overrides.items():  # a moved key given as an override is named as one
        refuse_moved_keys(_tree_of(dotted, value), f"{source}: {origin} {dotted}={value!r}")
    refuse_moved_keys(tree, source)
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as err:
        problems = "; ".join(f"{_origin(item, overrides, origin)}{_describe(item)}" for item in err.errors())
        raise ConfigError(f"{source}: {problems}") from err


def _tree_of(dotted: str, value: Any) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    _set_dotted(tree, dotted, value)
    return tree


def _origin(error: ErrorDetails, overrides: dict[str, Any], origin: str = "--set") -> str:
    """'<origin> KEY=VALUE: ' when the failing key came from an override (or lies inside one), else ''."""
    key = ".".join(str(part) for part in error["loc"])
    for dotted, value in overrides.items():
        if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + "."):
            return f"{origin} {dotted}={value!r}: "
    return ""
