"""Export-only mode: a user's model (`--model`) and data set (`--data`) instead of the built-in trainer.

Model sources: a Keras file (`.keras`, `.h5`), a SavedModel folder (its `serving_default` is re-exported
through a forward-only module), or a factory `package.module:function` returning a `keras.Model`.
Data: an NPZ (`x`/`y`, or one array per input name plus optional `y`), a CSV with a header row (every
column except `label`/`y` stacked into the single input) or an image folder `<root>/<class>/<file>`
(resized to the single input's height and width). Readers come from `pipeline.data.sources`; NPZ files with
float (regression) labels or no labels are read here, since `sources.read_npz` encodes class labels.
All rows serve validation; a seeded subset of at most `convert.representative_samples` rows calibrates int8.
"""

from __future__ import annotations

import importlib
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import ConfigError, DatasetError
from tfship.core.imports import import_function

LABEL_KEYS = ("y", "label", "labels")
# Where a request came from, and how each of its parts is named there: the command line's flag or the
# Python argument (`tfship.ship(model=...)`), so a refusal names what the caller typed.
ORIGINS = ("cli", "python")
_FLAGS = {"model": "--model", "data": "--data", "custom_objects": "--custom-objects"}


def argument(origin: str, key: str, value: object = "...") -> str:
    """`key` ("model", "data", "custom_objects") with `value` as the caller gave it: `--model x.keras` from the
    command line (`origin` "cli"), `tfship.ship(model='x.keras')` from Python ("python").
    """
    if origin == "python":
        if value != "...":
            value = repr(list(value) if isinstance(value, tuple | list) else str(value))
        return f"tfship.ship({key}={value})"
    shown = " ".join(value) if isinstance(value, tuple | list) else value
    return f"{_FLAGS[key]} {shown}"


@dataclass(frozen=True)
class EvalData:
    """Data the export-only stages run on.

    inputs: {contract input name: [N, ...]} in the contract's dtypes (strings as numpy unicode);
    labels: [N] int64 classes, [N, ...] float targets, or None; calibration: the int8
    representative rows; class_names: index -> name when known.
    """

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    calibration: dict[str, np.ndarray]
    class_names: tuple[str, ...] = ()
    source: str = ""

    def summary(self) -> dict:
        """Row counts and where the data came from."""
        return {"source": self.source, "rows": len(next(iter(self.inputs.values()))),
                "labels": self.labels is not None, "calibration_rows": len(next(iter(self.calibration.values())))}


def import_custom_objects(modules: tuple[str, ...], origin: str = "cli") -> None:
    """Import each `--custom-objects` module, so the Keras classes it registers
    (`@keras.saving.register_keras_serializable`) are known before a `.keras` file is loaded.

    Raises:
        ConfigError: a module cannot be imported (the cause is kept).
    """
    if modules and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:
            raise ConfigError(f"{argument(origin, 'custom_objects', (name,))}: cannot import it: "
                              f"{type(err).__name__}: {err}") from err


_UNKNOWN_CLASS = re.compile(r"Could not locate (?:class|function) '([^']+)'"
                            r"|Unknown (?:layer|object)[^'\"]*['\"]([^'\"]+)")


_LAMBDA_HELP = ("tfship loads with Keras' safe mode on and has no switch to turn it off: rebuild the model without "
                "the Lambda layer (a built-in layer or plain ops), or write it as a layer class registered with "
                "@keras.saving.register_keras_serializable and give its module with {custom}")


def _keras_load_error(spec: str, err: Exception | None, modules: tuple[str, ...], name: str = "",
                      origin: str = "cli") -> ConfigError:
    """The error for a Keras file Keras cannot load (`err`), or whose class `name` no module registers; a
    refusal that asks for `safe_mode=False` (Keras' own, for a Lambda) says what the user can do instead.
    """
    text = " ".join(f"{type(err).__name__}: {err}".split()) if err is not None else ""
    match = _UNKNOWN_CLASS.search(text)
    model = argument(origin, "model", spec)
    if "safe_mode" in text:  # the cause kept, without the option tfship cannot take
        cause = " ".join(part for part in re.split(r"(?<=\.)\s+", text) if "safe_mode" not in part)
        return ConfigError(f"{model}: Keras refuses to load code stored in the file ({cause.rstrip('.')}); "
                           + _LAMBDA_HELP.format(custom=argument(origin, "custom_objects", ("package.module",))))
    if match is None and not name:
        return ConfigError(f"{model}: Keras cannot load it: {text}")
    tried = f"; imported {list(modules)}, which did not register it" if modules else ""
    name = name or (match.group(1) or match.group(2) if match is not None else "")
    return ConfigError(
        f"{model}: Could not locate class '{name}' (a custom class Keras does not know{tried}). Give the "
        "module that defines and registers it (@keras.saving.register_keras_serializable) with "
        f"{argument(origin, 'custom_objects', ('package.module',))} (imported before loading), or pass "
        f"{argument(origin, 'model', 'package.module:function')}, a factory that builds or loads the model itself")


def _refuse_code_in_config(spec: str, path: Path, modules: tuple[str, ...], origin: str = "cli") -> None:
    """Refuse a Keras file whose config names code or an unregistered class (`pipeline.export_only.keras_config`)
    before Keras reads it.
    """
    from tfship.pipeline.export_only.keras_config import keras_config_problems, read_keras_config

    try:
        code, unregistered = keras_config_problems(read_keras_config(path))
    except ValueError as err:
        raise ConfigError(f"{argument(origin, 'model', spec)}: not a Keras file: {err}") from err
    if code:
        more = f" (+{len(code) - 3} more)" if len(code) > 3 else ""
        help_ = ("; " + _LAMBDA_HELP.format(custom=argument(origin, "custom_objects", ("package.module",)))
                 if any("Lambda" in line for line in code) else "")
        raise ConfigError(f"{argument(origin, 'model', spec)}: refused before loading: {'; '.join(code[:3])}{more}"
                          f"{help_}")
    if unregistered:
        raise _keras_load_error(spec, None, modules, unregistered[0], origin)


def load_user_model(spec: str, custom_objects: tuple[str, ...] = (), origin: str = "cli"):
    """Load `spec` as a Keras model, or return the SavedModel folder's Path for re-export.

    Args:
        spec: a `.keras` / `.h5` file, a SavedModel folder or `package.module:function`.
        custom_objects: modules imported first (`--custom-objects`): they register the custom layers the
            file names.
        origin: "cli" or "python": refusals name `--model` or `tfship.ship(model=...)` (`argument`).

    Raises:
        ConfigError: the path does not exist, a custom-objects module or the factory cannot be imported,
            the factory does not return a `keras.Model`, the file's config names code (a Lambda layer, a
            TFSMLayer, a class no imported module registers: refused before Keras reads it), or the file cannot be
            loaded (the cause is kept; an unknown custom class names `--custom-objects` and the `module:function`
            route; Keras' safe-mode refusal of a Lambda says how to rebuild or register the layer instead).
    """
    import keras

    import tfship.pipeline.training.sparse_embedding  # noqa: F401  (registers tfship's own layers for .keras files)

    import_custom_objects(tuple(custom_objects), origin)
    model_arg = argument(origin, "model", spec)
    path = Path(spec)
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise ConfigError(f"{model_arg}: folder holds no saved_model.pb")
        return path
    if path.suffix in (".keras", ".h5"):
        if not path.is_file():
            raise ConfigError(f"{model_arg}: file not found")
        _refuse_code_in_config(spec, path, tuple(custom_objects), origin)
        try:
            return keras.models.load_model(path, compile=False)
        except Exception as err:
            raise _keras_load_error(spec, err, tuple(custom_objects), origin=origin) from err
    if ":" not in spec:
        raise ConfigError(f"{model_arg}: expected a .keras/.h5 file, a SavedModel folder or module:function")
    factory = import_function(spec, model_arg)
    try:
        model = factory()
    except Exception as err:
        raise ConfigError(f"{model_arg}: factory failed: {type(err).__name__}: {err}") from err
    if not isinstance(model, keras.Model):
        raise ConfigError(f"{model_arg}: factory returned {type(model).__name__}, expected a keras.Model")
    return model


def _as_text(name: str, array: np.ndarray, where: str) -> np.ndarray:
    """A text input as numpy unicode, whether the file holds `str`, UTF-8 `bytes` or objects of either."""
    from tfship.pipeline.conversion.artifacts import as_text

    if array.dtype.kind not in "OSU":
        raise DatasetError(f"{where}: input '{name}' is a string input; the array holds {array.dtype} values")
    try:
        return as_text(array)
    except UnicodeDecodeError as err:
        raise DatasetError(f"{where}: input '{name}' holds bytes that are not UTF-8 text: {err}") from err


def _coerce(name: str, array: np.ndarray, dtype: str, shape: tuple | None, where: str) -> np.ndarray:
    if dtype == "string":
        array = _as_text(name, np.asarray(array), where)
    else:
        array = np.asarray(array).astype(dtype)
    if shape is not None and array.ndim == len(shape) - 1 and shape[-1] == 1:  # a column [N] for [N, 1]
        array = array[..., None]
    if shape is not None and (array.ndim != len(shape)
                              or any(w is not None and w != g for w, g in zip(shape[1:], array.shape[1:]))):
        raise DatasetError(f"{where}: array for input '{name}' has shape {list(array.shape)}; the model expects "
                           f"{[-1 if d is None else d for d in shape]}")
    return array


def _read_arrays(path: Path, contract: Signature) -> tuple[dict[str, np.ndarray], np.ndarray | None, tuple]:
    from tfship.pipeline.data import sources

    names = list(contract.input_names())
    if path.is_dir():
        (single,) = contract.inputs.values() if len(contract.inputs) == 1 else (None,)
        if single is None or single.shape is None or len(single.shape) != 4:
            raise DatasetError(f"{path}: an image folder needs a model with one [B, H, W, C] input; has {names}")
        _, height, width, channels = single.shape
        if height is None or width is None:  # the folder's images are resized to the input's height and width
            raise DatasetError(f"{path}: an image folder needs the model's input height and width fixed; "
                               f"{single.name} is {single.describe()}")
        data = sources.read_image_folder(path, (height, width), input_name=single.name,
                                         color_mode="grayscale" if channels == 1 else "rgb")
        return data.features, data.labels, data.class_names
    if path.suffix == ".csv":
        if len(names) != 1:
            raise DatasetError(f"{path}: a CSV fills one input; the model has {names}: use an NPZ")
        header = path.read_text(encoding="utf-8").splitlines()[0].split(",")
        label = next((k for k in LABEL_KEYS if k in header), None)
        if label is None:
            raise DatasetError(f"{path}: no label column (one of {LABEL_KEYS}) in the header {header}")
        data = sources.read_csv(path, [], label, input_name=names[0])
        return data.features, data.labels, data.class_names
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: np.asarray(archive[k]) for k in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DatasetError(f"{path}: cannot read NPZ (x/y or one array per input): {err}") from err
    keys = {n: ("x" if len(names) == 1 and n not in arrays and "x" in arrays else n) for n in names}
    missing = [n for n, key in keys.items() if key not in arrays]
    if missing:
        raise DatasetError(f"{path}: missing arrays {missing} for the model's inputs; the file has {sorted(arrays)}")
    label = next((k for k in LABEL_KEYS if k in arrays), None)
    if label is not None and arrays[label].dtype.kind in "US":  # class names: the shared reader encodes them
        # (sorted names -> ids); integer labels are kept as they are, so they stay the model's class ids.
        data = sources.read_npz(path, list(keys.values()), label)
        return {n: data.features[key] for n, key in keys.items()}, data.labels, data.class_names
    return {n: arrays[key] for n, key in keys.items()}, (arrays[label] if label else None), ()


def _check_values(path: Path, inputs: dict[str, np.ndarray], labels: np.ndarray | None,
                  classes: tuple[str, ...]) -> None:
    """Refuse non-finite features and integer labels outside [0, number of declared classes)."""
    for name, value in inputs.items():
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            row = int(np.nonzero(~np.isfinite(value.reshape(len(value), -1)).all(axis=1))[0][0])
            raise DatasetError(f"{path}: input '{name}' holds NaN or Inf (first at row {row}); clean the data")
    if labels is None or labels.dtype.kind not in "iu":
        return
    upper = len(classes) if classes else None
    bad = np.nonzero((labels < 0) | ((labels >= upper) if upper else False))[0]
    if bad.size:
        allowed = f"0..{upper - 1} (data.classes declares {upper})" if upper else ">= 0"
        raise DatasetError(f"{path}: label {int(labels[bad[0]])} at row {int(bad[0])} is outside the declared "
                           f"classes; allowed {allowed} ({bad.size} bad row(s))")


def load_user_data(path: Path | str, contract: Signature, calibration_rows: int, seed: int,
                   classes: tuple[str, ...] = (), origin: str = "cli") -> EvalData:
    """Read `--data` for the model's contract: validation inputs, labels and int8 calibration rows.

    Args:
        classes: declared class names (`data.classes`); integer labels must index them. Empty: the
            names the file itself gives (CSV / image folder / string labels), if any.
        origin: "cli" or "python": a missing path is named as `--data` or `tfship.ship(data=...)`.

    Raises:
        DatasetError: unreadable file, missing arrays or columns, shape or row-count mismatch (named).
    """
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{argument(origin, 'data', path)}: not found")
    features, labels, file_classes = _read_arrays(path, contract)
    classes = tuple(classes) or tuple(file_classes)
    inputs = {t.name: _coerce(t.name, features[t.name], t.dtype, t.shape, str(path)) for t in contract.inputs.values()}
    rows = {name: len(value) for name, value in inputs.items()}
    if labels is not None:
        rows["labels"] = len(labels)
    if len(set(rows.values())) != 1 or 0 in rows.values():
        raise DatasetError(f"{path}: arrays need the same non-zero number of rows; got {rows}")
    if labels is not None:
        labels = labels.astype(np.float64) if labels.dtype.kind == "f" else labels.astype(np.int64)
    _check_values(path, inputs, labels, classes)
    pick = np.sort(np.random.default_rng(seed).permutation(len(next(iter(inputs.values()))))[:calibration_rows])
    return EvalData(inputs, labels, {k: v[pick] for k, v in inputs.items()}, classes, str(path))


@dataclass(frozen=True)
class ExportOnlyRequest:
    """`tfship run --model SPEC --data PATH`: the model to export and the data to validate/calibrate on.

    tags: the SavedModel MetaGraph tag-set to export (`--tags`, default `serve`); custom_objects: modules
    imported before a Keras file is loaded (`--custom-objects`); origin: where the request came from, "cli"
    (`tfship run`) or "python" (`tfship.ship`), so refusals name the flag or the argument (`argument`).
    """

    model: str
    data: Path
    tags: tuple[str, ...] = ("serve",)
    custom_objects: tuple[str, ...] = ()
    origin: str = "cli"

    def argument(self, key: str) -> str:
        """`key` ("model", "data", "custom_objects") named as the caller gave it (module-level `argument`)."""
        return argument(self.origin, key, getattr(self, key))
