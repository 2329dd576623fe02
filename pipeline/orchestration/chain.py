"""The stage chain, declared once, and the one runner for full runs, export-only runs, resume and single stages.

`CHAIN` lists the stages in order as `Stage` objects: each names the earlier stages whose records it reads
(`inputs`), the `StageContext` field its record goes to (`field`) and where that record lives in the run folder
(`record`: `pipeline.orchestration.records`), the files it writes (`outputs`), the function that runs it, how
its record is summarised in `stages.json`, and how the run folder shows it complete. `run_chain` walks the
chain for every mode:

* `full`: every stage on a fresh run folder (built-in data and training, or export-only when the context
  holds an `ExportOnlyRequest`: the user's model, training skipped);
* `resume`: stages whose outputs are complete and valid are not rerun (their record is read back into the
  context); from the first incomplete one on, every stage reruns;
* `single`: one stage alone in an existing run folder (`pipeline.orchestration.run.run_single_stage`
  semantics: its `inputs`' records are read from the run folder; its own record replaced, later ones outdated
  when it rewrote artifacts or failed).

Stages hand their results to later stages through the `StageContext`'s typed fields (`train`, `export`,
`convert`, `validate`, `serve_check`, `publish`), never through file names or dicts; a stage that runs alone
or in a resumed run gets the run's own data (`load_run_data`: an export-only run's `--data`, read for its
contract, else the config's splits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfship.core.errors import ConfigError, StageError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.orchestration import steps
from tfship.pipeline.orchestration.context import StageContext
from tfship.pipeline.orchestration.publish import PublishResult
from tfship.pipeline.orchestration.records import (
    CONVERT,
    EXPORT,
    PUBLISH,
    SERVE_CHECK,
    TRAIN,
    VALIDATE,
    ExportRecord,
    RecordFile,
    TrainRecord,
    read_json,
)
from tfship.pipeline.orchestration.run_config import RunConfig
from tfship.pipeline.orchestration.stages import RunFolder, StageRecord

if TYPE_CHECKING:
    from tfship.pipeline.data.split_types import DatasetSplits
    from tfship.pipeline.export_only.user_model import EvalData

HELD_OUT = "held_out.npz"  # a named-input run's held-out rows (export, gate, `tfship query --run`)
RESUMED = {"skipped": "outputs complete and valid in the resumed run; not rerun"}


@dataclass(frozen=True)
class Stage:
    """One stage of the chain (see the module docstring).

    run: returns the stage's record, which `perform` puts in `StageContext.<field>` (the data and train stages
    also set the context's `data` / `model`).
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: Callable[[StageContext], Any]
    summarise: Callable[[Any], dict] = lambda _: {}
    field: str | None = None
    record: RecordFile | None = None
    complete: Callable[[RunFolder], bool] = lambda run: False
    rewrites_artifacts: bool = False

    def perform(self, ctx: StageContext) -> Any:
        """Run the stage and keep its record in the context; returns the record."""
        value = self.run(ctx)
        if self.field is not None:
            setattr(ctx, self.field, value)
        return value

    def read_back(self, ctx: StageContext) -> Any:
        """Fill the context's field from the stage's record in the run folder (a resumed, complete stage).

        Raises:
            StageError: the record is missing or unreadable.
        """
        if self.record is None or self.field is None:
            return None
        value = self.record.require(ctx.run)
        setattr(ctx, self.field, value)
        return value


def run_data(ctx: StageContext) -> Any:
    """The run's data, loaded once into `ctx.data` (`load_run_data`: `DatasetSplits` or the user's `EvalData`)."""
    if ctx.data is None:
        ctx.data = load_run_data(ctx.config, ctx.run)
    return ctx.data


def load_run_data(config: PipelineConfig, run: RunFolder) -> DatasetSplits | EvalData:
    """The data a run folder was made with: an export-only run's own `--data` file (read for its contract),
    else the config's splits (`pipeline.data.splits.load_splits`: every kind, task and source).

    Raises:
        DatasetError, StageError: the data cannot be read, or the run has no SavedModel yet.
    """
    from tfship.pipeline.data.splits import load_splits, scan_cache_dir

    stored = stored_run_config(run)
    if stored is not None and stored.export_only is not None:
        from tfship.pipeline.export_only.user_model import load_user_data

        return load_user_data(Path(stored.export_only.data), steps.read_contract(run),
                              config.convert.representative_samples, config.run.seed, config.data.classes)
    from tfship.pipeline.training.input_specs import check_trainable

    check_trainable(config)  # before any data is read: a config that cannot train stops here
    if _is_named(config):
        return _named_run_data(config, run)
    return load_splits(config, scan_cache_dir(config))


def _named_run_data(config: PipelineConfig, run: RunFolder) -> DatasetSplits | EvalData:
    """A named-input (or non-classification) run's data: its held-out rows (`held_out.npz`, read for the
    exported contract) once the export wrote them, else the config's splits (`load_splits`).
    """
    from tfship.pipeline.data.splits import load_splits, scan_cache_dir

    held_out = run.root / HELD_OUT
    if held_out.is_file() and (run.artifacts / "saved_model.pb").is_file():
        from tfship.pipeline.export_only.user_model import load_user_data

        return load_user_data(held_out, steps.read_contract(run), config.convert.representative_samples,
                              config.run.seed, config.data.classes if config.model.task == "classification" else ())
    return load_splits(config, scan_cache_dir(config))


def stored_run_config(run: RunFolder) -> RunConfig | None:
    """The run's `config.json` as written when it started (None when missing or unreadable): the config and,
    for an export-only run, its request (`pipeline.orchestration.run_config.RunConfig`).
    """
    try:
        return RunConfig.read(run)
    except ConfigError:
        return None


def _passed(run: RunFolder, record: RecordFile) -> bool:
    value = record.load(run)
    return value is not None and bool(value.passed)


def _data(ctx: StageContext) -> Any:
    if ctx.request is not None:
        from tfship.pipeline.export_only.user_model import load_user_model

        ctx.model = load_user_model(ctx.request.model, ctx.request.custom_objects, ctx.request.origin)
        return ctx.model
    from tfship.pipeline.data.splits import load_splits, scan_cache_dir
    from tfship.pipeline.training.input_specs import check_trainable

    check_trainable(ctx.config)  # before any data is read: a config that cannot train stops here
    ctx.data = load_splits(ctx.config, scan_cache_dir(ctx.config))
    return ctx.data


def _summarise_data(value) -> dict:
    """The data stage's record: the splits' own summary, or for an export-only Keras model its name, layer
    and parameter counts (never `keras.Model.summary()`, which prints a table of every layer).
    """
    if hasattr(value, "count_params") and hasattr(value, "layers"):  # a Keras model (export-only `--model`)
        return {"kind": "keras_model", "name": value.name, "layers": len(value.layers),
                "parameters": int(value.count_params())}
    return value.summary() if hasattr(value, "summary") else {"kind": type(value).__name__}


def _train(ctx: StageContext) -> TrainRecord:
    resume = ctx.resume_training and (ctx.run.checkpoints / "checkpoint").is_file()
    result = steps.train_step_stage(ctx.config, ctx.run, run_data(ctx), ctx.progress, resume=resume)
    ctx.model = result.model
    return TrainRecord.from_result(result)


def _export(ctx: StageContext) -> ExportRecord:
    if ctx.request is not None:
        if ctx.model is None:
            raise StageError("export: the user's model is not loaded; run the data stage first")
        exported, ctx.data = steps.export_user_stage(ctx.config, ctx.run, ctx.model, ctx.request.data,
                                                     ctx.request.tags, ctx.request.origin)
    elif _is_named(ctx.config):  # named inputs: exported, gated and queried on the held-out rows, by name
        exported, ctx.data = steps.export_user_stage(ctx.config, ctx.run, _trained_model(ctx), _held_out(ctx))
    else:
        exported = steps.export_stage(ctx.config, ctx.run, run_data(ctx), ctx.model)
    return exported.record


def _is_named(config: PipelineConfig) -> bool:
    from tfship.pipeline.training.input_specs import is_named

    return is_named(config)


def _trained_model(ctx: StageContext):
    """The trained model: the train stage's, else `model.keras` (tfship's layers registered first)."""
    if ctx.model is not None:
        return ctx.model
    import keras

    import tfship.pipeline.training.sparse_embedding  # noqa: F401  (registers tfship's layers)

    path = ctx.run.root / "model.keras"
    if not path.is_file():
        raise StageError(f"export: {path} does not exist; run the train stage first")
    return keras.models.load_model(path)


def _held_out(ctx: StageContext) -> Path:
    """`held_out.npz`: the test split's first `data.sample_size` rows, one array per input and `y`."""
    from tfship.pipeline.data.held_out import write_held_out
    from tfship.pipeline.data.split_types import DatasetSplits
    from tfship.pipeline.data.splits import load_splits, scan_cache_dir

    path = ctx.run.root / HELD_OUT
    data = run_data(ctx)
    write_held_out(data if isinstance(data, DatasetSplits) else load_splits(ctx.config, scan_cache_dir(ctx.config)),
                   path)
    return path


def _publish(ctx: StageContext) -> PublishResult:
    if ctx.request is not None:
        parity = ctx.validate
        metrics = {"reference_metric": parity.reference_metric if parity else None,
                   "metric": parity.metric if parity else None}
    else:
        train = ctx.train.to_json() if ctx.train is not None else {}
        metrics = {"test_accuracy": train.get("test_accuracy"), "train": train}
    return steps.publish_stage(ctx.config, ctx.run, run_data(ctx), ctx.repository, metrics, ctx.export,
                               ctx.convert, ctx.validate, ctx.serve_check)


def _published(run: RunFolder) -> bool:
    try:
        summary = read_json(run, PUBLISH.name)
    except (OSError, ValueError):
        return False
    return bool(summary.get("published")) and Path(summary["published"]).is_dir()


CHAIN: tuple[Stage, ...] = (
    Stage("data", (), (), _data, _summarise_data),
    Stage("train", ("data",), ("train.json",), _train, lambda r: r.summary, "train", TRAIN,
          lambda run: (run.root / "model.keras").is_file() and TRAIN.load(run) is not None, True),
    Stage("export", ("data", "train"), ("audit.json", "export.json", "data.json"), _export,
          lambda e: e.summary(), "export", EXPORT,
          complete=lambda run: (run.artifacts / "saved_model.pb").is_file() and _passed(run, EXPORT),
          rewrites_artifacts=True),
    Stage("convert", ("export",), ("convert.json",),
          lambda ctx: steps.convert_stage(ctx.config, ctx.run, run_data(ctx), ctx.export),
          lambda c: {o.name: o.status for o in c.outcomes}, "convert", CONVERT,
          complete=lambda run: CONVERT.load(run) is not None, rewrites_artifacts=True),
    Stage("validate", ("convert",), ("parity.json",),
          lambda ctx: steps.validate_stage(ctx.config, ctx.run, run_data(ctx), ctx.convert),
          lambda p: {r.artifact: round(r.metric, 4) for r in p.rows} | {"left_out": sorted(p.left_out)},
          "validate", VALIDATE, complete=lambda run: _passed(run, VALIDATE)),
    Stage("serve-check", ("convert", "validate"), ("serve_check.json",),
          lambda ctx: steps.serve_check_stage(ctx.config, ctx.run, run_data(ctx), ctx.convert, ctx.validate),
          lambda s: {"served": s.served, "left_out": sorted(s.left_out)}, "serve_check", SERVE_CHECK,
          complete=lambda run: _passed(run, SERVE_CHECK)),
    Stage("publish", ("train", "export", "convert", "validate", "serve-check"), (), _publish,
          lambda p: {"version": p.version, "path": str(p.version_dir)}, "publish", PUBLISH, _published),
)
STAGES = {stage.name: stage for stage in CHAIN}


def _check_inputs() -> None:
    """Every stage's `inputs` name earlier stages (the chain's order is the hand-off order)."""
    for index, stage in enumerate(CHAIN):
        earlier = {s.name for s in CHAIN[:index]}
        if not set(stage.inputs) <= earlier:
            raise AssertionError(f"stage {stage.name!r} reads {sorted(set(stage.inputs) - earlier)}, "
                                 "which do not run before it")


_check_inputs()


def read_inputs(ctx: StageContext, stage: Stage) -> None:
    """Fill the context's fields for `stage.inputs` that are still None from their records in the run folder
    (a stage run alone); a missing record stays None, and the stage says what to run first.
    """
    for name in stage.inputs:
        earlier = STAGES[name]
        if earlier.field is not None and earlier.record is not None and getattr(ctx, earlier.field) is None:
            setattr(ctx, earlier.field, earlier.record.load(ctx.run))


def read_records(ctx: StageContext) -> None:
    """Fill every stage field still None from the run folder's records (what a failed run's report shows)."""
    for stage in CHAIN:
        if stage.field is not None and stage.record is not None and getattr(ctx, stage.field) is None:
            setattr(ctx, stage.field, stage.record.load(ctx.run))


def stage_named(name: str) -> Stage:
    """The chain's stage `name`.

    Raises:
        StageError: no such stage.
    """
    if name not in STAGES:
        raise StageError(f"unknown stage {name!r}; stages: {list(STAGES)}")
    return STAGES[name]


def run_chain(ctx: StageContext, runner, resume: bool = False) -> list[StageRecord]:
    """Run the whole chain in `ctx.run` (fresh, or resumed), recording each stage with `runner`
    (`pipeline.orchestration.run.StageRunner`); returns the records.

    Raises:
        TfshipError: the failing stage's error (its record is already written).
    """
    rerun = not resume
    for stage in CHAIN:
        if stage.name == "train" and ctx.request is not None:
            runner.skip("train", f"{ctx.request.argument('model')} given: export-only")
            continue
        if stage.name == "data" or rerun or not stage.complete(ctx.run):
            rerun = rerun or stage.name != "data"
            runner(stage.name, lambda s=stage: s.perform(ctx), stage.summarise)
        else:
            runner(stage.name, lambda s=stage: s.read_back(ctx), lambda _: RESUMED)
    return runner.records
