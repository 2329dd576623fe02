"""`tfship.ship(model_or_path, data, repository=...)`: the pipeline as one call, and each stage alone.

`ship` runs export -> convert -> validate -> serve-check -> publish on a user's model (training skipped), or
the built-in data -> train -> ... chain when no model is given, and returns a `ShipResult`. `tfship run` goes
through the same `ship_configured`, so the command line and the API cannot disagree. The stages alone
(`train`, `export`, `convert`, `validate`, `publish`) work on a run folder as `tfship <stage>` does.

A model object (`keras.Model`) and in-memory data (arrays) are written into `<runs_dir>/.inputs/<stamp>/`
(`model.keras`, `data.npz`) first, so the run folder records a path, as for a file, and `resume` works.

TensorFlow is imported only when a stage runs (or a model object is saved).
"""

from __future__ import annotations

import datetime as _dt
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tfship.core.errors import ConfigError
from tfship.core.files import write_npz
from tfship.pipeline.api.data_forms import model_input_names, named_arrays
from tfship.pipeline.api.results import ShipResult
from tfship.pipeline.config import PipelineConfig, load_config
from tfship.pipeline.conversion.artifacts import check_required
from tfship.pipeline.export_only.user_model import ExportOnlyRequest
from tfship.pipeline.orchestration.report import write_report
from tfship.pipeline.orchestration.resume import resume_pipeline
from tfship.pipeline.orchestration.run import run_export_only, run_pipeline
from tfship.pipeline.orchestration.stages import StageRecord

# Keyword arguments of `ship` / the stages that are config sections (`train={"epochs": 1}`).
SECTIONS = ("run", "data", "model", "train", "export", "convert", "validate", "publish")
StageCallback = Callable[[str, StageRecord], None]


def configure(config: Path | str | None = None, overrides: Mapping[str, Any] | None = None,
              **settings: Mapping[str, Any]) -> PipelineConfig:
    """The validated pipeline config: `config` (a TOML path; None: the bundled digits config), then the
    sections in `settings` (`train={"epochs": 1}` sets `train.epochs`), then dotted `overrides`
    (`{"convert.onnx": False}`, as `--set` on the command line).

    Raises:
        ConfigError: an unknown section, key or invalid value (named), or a `convert.required` artifact the
            config does not produce.
    """
    dotted: dict[str, Any] = {}
    for section, values in settings.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown setting {section!r}: settings are config sections {list(SECTIONS)}, "
                              "each a dict (e.g. train={'epochs': 1})")
        if not isinstance(values, Mapping):
            raise ConfigError(f"setting {section}={values!r}: expected a dict of that section's keys")
        dotted |= {f"{section}.{key}": value for key, value in values.items()}
    resolved = load_config(config, dotted | dict(overrides or {}), origin="argument")

    check_required(resolved.convert)
    return resolved


def ship_configured(config: PipelineConfig, request=None, resume: str | Path | None = None, progress=None,
                    on_stage: StageCallback | None = None) -> ShipResult:
    """Run the pipeline for a resolved config and write the run's report: the built-in chain, an export-only
    run (`request`: `pipeline.export_only.user_model.ExportOnlyRequest`) or a resumed run (`resume`: a run
    folder, a run id or "latest"). `tfship run` and `ship` both end here.

    Raises:
        TfshipError: the failing stage's error; the run folder's report.json and report.md say what ran.
    """
    if resume is not None:
        result = resume_pipeline(resume, config, progress, on_stage)
    elif request is not None:
        result = run_export_only(config, config.publish.repository, request, on_stage)
    else:
        result = run_pipeline(config, config.publish.repository, progress, on_stage)
    write_report(result.run, result.summary)
    return ShipResult.from_summary(config.run.model_name, result.run, result.summary, list(result.records),
                                   result.published.outcomes if result.published is not None else ())


def model_name_from(model: str) -> str:
    """A repository name for a user's model: the file's stem, the SavedModel folder's name (its parent's when the
    folder is a version number) or the function's name of `module:function`, reduced to `[A-Za-z0-9_.-]`, at
    most 64 characters ("model" when nothing is left).
    """
    path = Path(model)
    if ":" in model and not path.exists():
        raw = model.rsplit(":", 1)[1]
    elif path.is_dir():
        resolved = path.resolve()
        raw = resolved.parent.name if resolved.name.isdigit() else resolved.name
    else:
        raw = path.stem
    return repository_name(raw)


def repository_name(raw: str) -> str:
    """`raw` (a Keras model's `name`, a file stem) reduced to `[A-Za-z0-9_.-]`, at most 64 characters, kept
    whole otherwise (`mobilenetv2_0.35_96` stays itself: a dot is no file suffix here); "model" when empty.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", raw).lstrip("_.-")[:64]
    return name or "model"


def _inputs_folder(runs_dir: Path) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    # A dot folder: `latest_run` (which picks the newest run folder by name) skips it.
    folder = Path(runs_dir) / ".inputs" / f"{stamp}-{secrets.token_hex(2)}"
    folder.mkdir(parents=True)
    return folder.resolve()


def _model_spec(model: Any, runs_dir: Path) -> str:
    """A path or `module:function` as given; a `keras.Model` saved as `model.keras` first."""
    if isinstance(model, (str, Path)):
        return str(model)
    import keras  # TensorFlow: loaded only to save a model object

    if not isinstance(model, keras.Model):
        raise ConfigError(f"ship: model is a {type(model).__name__}; expected a keras.Model, a .keras/.h5 file, "
                          "a SavedModel folder or 'module:function'")
    path = _inputs_folder(runs_dir) / "model.keras"
    model.save(path)
    return str(path)


def _data_path(data: Any, runs_dir: Path, input_names: tuple[str, ...] | None = None) -> Path:
    """A file or folder as given; in-memory data (`pipeline.api.data_forms`: `(x, y)` with x an array, a list
    or a dict, a tf.data.Dataset of `(x, y)` batches, a dict of arrays or an array) written to `data.npz`.
    """
    if isinstance(data, (str, Path)):
        return Path(data)
    arrays = named_arrays(data, input_names)
    path = _inputs_folder(runs_dir) / "data.npz"
    write_npz(path, arrays)
    return path


def ship(model: Any = None, data: Any = None, *, repository: Path | str | None = None,
         config: Path | str | None = None, model_name: str | None = None, runs_dir: Path | str | None = None,
         tags: tuple[str, ...] = ("serve",), custom_objects: tuple[str, ...] = (), resume: str | Path | None = None,
         overrides: Mapping[str, Any] | None = None, on_stage: StageCallback | None = None,
         **settings: Mapping[str, Any]) -> ShipResult:
    """Export, convert, validate, serve-check and publish a model; return what happened to every artifact.

    Args:
        model: a `keras.Model`, a `.keras`/`.h5` file, a SavedModel folder or `package.module:function` (a
            factory returning a `keras.Model`). None: the config's built-in data and training (digits by
            default) run first.
        data: validation and int8 calibration data for `model`: an NPZ / CSV file or image folder (see
            docs/bring-your-own-model.md), `(x, y)` with `x` an array, a list of arrays (model input order)
            or a dict {input name: [N, ...] array}, a finite `tf.data.Dataset` of `(x, y)` batches, a dict
            {input name: array, optional "y": [N] labels} or an `x` array (`pipeline.api.data_forms`).
            Required with `model`, ignored without.
        repository: the model repository, `<repository>/<model_name>/<version>/` (default: the config's
            `publish.repository`, `models`).
        config: pipeline TOML (default: the bundled `configs/digits.toml`).
        model_name: the name in the repository (default: the config's; for `model` without `config`, the
            file's, folder's, function's or Keras model's name).
        runs_dir: where the run folder goes (default: the config's `run.runs_dir`, `runs`).
        tags, custom_objects: the SavedModel tag-set to export; modules imported before a Keras file loads.
        resume: continue the run in this folder (or run id, or "latest") instead of starting one.
        overrides: dotted config keys, as `--set` (`{"convert.onnx": False}`).
        on_stage: called with (stage name, `StageRecord`) as each stage ends.
        **settings: config sections as dicts, e.g. `train={"epochs": 2}`, `convert={"tflite_modes": ["float32"]}`.

    Returns:
        `ShipResult`: status (`published` / `partial`), per-artifact outcomes with their published paths, the
        stage records, the run folder and its report (tables in a notebook).

    Raises:
        ConfigError: bad arguments or settings (named); DatasetError: unreadable data; TfshipError: a stage
        failed and nothing was published (the run folder's report.md says why; `ShipResult.load(run)` shows it).
    """
    if (model is None) != (data is None) and resume is None:
        raise ConfigError("ship: model and data go together (data validates and calibrates the model); "
                          "give neither to run the config's built-in training")
    extra = dict(overrides or {})
    if repository is not None:
        extra["publish.repository"] = str(repository)
    if runs_dir is not None:
        extra["run.runs_dir"] = str(runs_dir)
    if model_name is not None:
        extra["run.model_name"] = model_name
    resolved = configure(config, extra, **settings)
    request = None
    if model is not None and resume is None:
        names = None if isinstance(model, (str, Path)) else model_input_names(model)
        # Data is checked before anything is written: a refused form leaves no saved model behind.
        data = data if isinstance(data, (str, Path)) else named_arrays(data, names)
        spec = _model_spec(model, resolved.run.runs_dir)
        if model_name is None and config is None and "run.model_name" not in extra:
            name = getattr(model, "name", None) if not isinstance(model, (str, Path)) else None
            chosen = repository_name(name) if name else model_name_from(spec)
            resolved = configure(config, extra | {"run.model_name": chosen}, **settings)
        request = ExportOnlyRequest(spec, _data_path(data, resolved.run.runs_dir), tuple(tags),
                                    tuple(custom_objects), origin="python")
    return ship_configured(resolved, request, resume, on_stage=on_stage)
