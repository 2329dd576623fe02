"""The stage chain, declared once, and the one runner for full runs, export-only runs, resume and single stages.

`CHAIN` lists the stages in order as `Stage` objects: each names the earlier stages whose values it reads
(`inputs`), the record files it writes into the run folder (`outputs`), the function that runs it, how its
value is summarised in `stages.json`, how a resumed run rebuilds its value from the run folder, and how the
run folder shows it complete. `run_chain` walks the chain for every mode:

* `full`: every stage on a fresh run folder (built-in data and training, or export-only when the context
  holds an `ExportOnlyRequest`: the user's model, training skipped);
* `resume`: stages whose outputs are complete and valid are not rerun (their value is rebuilt); from the
  first incomplete one on, every stage reruns;
* `single`: one stage alone in an existing run folder (`pipeline.orchestration.run.run_single_stage`
  semantics: its own record replaced, later ones outdated when it rewrote artifacts or failed).

Stages hand values to later stages through the `StageContext` (typed fields, not file names); a stage
that runs alone or in a resumed run gets the run's own data (`load_run_data`: an export-only run's
`--data`, read for its contract, else the config's splits).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfship.core.errors import StageError
from tfship.core.locations import parse_location
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.orchestration import steps
from tfship.pipeline.orchestration.stages import RunFolder, StageRecord

RESUMED = {"skipped": "outputs complete and valid in the resumed run; not rerun"}


@dataclass
class StageContext:
    """What the stages of one run share.

    config: the run's config; run: its folder; repository: where publish puts the version; request: the
    export-only `--model`/`--data` (None for a built-in run); progress: a rich progress bar for training;
    resume_training: continue training from the latest checkpoint; data: the run's data (splits or the
    user's `EvalData`), set by the stage that loads it or lazily from the run folder; values: each
    stage's value by stage name.
    """

    config: PipelineConfig
    run: RunFolder
    repository: Path
    request: Any = None
    progress: Any = None
    resume_training: bool = False
    data: Any = None
    values: dict[str, Any] = field(default_factory=dict)

    def run_data(self):
        """The run's data, loaded once (see `load_run_data`)."""
        if self.data is None:
            self.data = load_run_data(self.config, self.run)
        return self.data


@dataclass(frozen=True)
class Stage:
    """One stage of the chain (see the module docstring)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: Callable[[StageContext], Any]
    summarise: Callable[[Any], dict] = lambda _: {}
    load: Callable[[StageContext], Any] = lambda ctx: None
    complete: Callable[[RunFolder], bool] = lambda run: False
    rewrites_artifacts: bool = False


def load_run_data(config: PipelineConfig, run: RunFolder):
    """The data a run folder was made with: an export-only run's own `--data` file (read for its contract),
    else the config's splits.

    Raises:
        DatasetError, StageError: the data cannot be read, or the run has no SavedModel yet.
    """
    from tfship.pipeline.data.splits import load_split_arrays

    stored = _json(run, "config.json") or {}
    if "export_only" in stored:
        from tfship.pipeline.export_only.user_model import load_user_data

        return load_user_data(Path(stored["export_only"]["data"]), steps.read_contract(run),
                              config.convert.representative_samples, config.run.seed, config.data.classes)
    return load_split_arrays(config.data, config.run.seed)


def _json(run: RunFolder, name: str):
    try:
        return json.loads((run.root / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _passed(run: RunFolder, name: str) -> bool:
    record = _json(run, name)
    return isinstance(record, dict) and bool(record.get("passed"))


def _data(ctx: StageContext):
    if ctx.request is not None:
        from tfship.pipeline.export_only.user_model import load_user_model

        return load_user_model(ctx.request.model, ctx.request.custom_objects)
    from tfship.pipeline.data.splits import load_split_arrays

    ctx.data = load_split_arrays(ctx.config.data, ctx.config.run.seed)
    return ctx.data


def _summarise_data(value) -> dict:
    """The data stage's record: the splits' own summary, or for an export-only Keras model its name, layer
    and parameter counts (never `keras.Model.summary()`, which prints a table of every layer).
    """
    if hasattr(value, "count_params") and hasattr(value, "layers"):  # a Keras model (export-only `--model`)
        return {"kind": "keras_model", "name": value.name, "layers": len(value.layers),
                "parameters": int(value.count_params())}
    return value.summary() if hasattr(value, "summary") else {"kind": type(value).__name__}


def _train(ctx: StageContext):
    resume = ctx.resume_training and (ctx.run.checkpoints / "checkpoint").is_file()
    return steps.train_step_stage(ctx.config, ctx.run, ctx.run_data(), ctx.progress, resume=resume)


def _load_trained(ctx: StageContext):
    import keras

    return keras.models.load_model(ctx.run.root / "model.keras")


def _export(ctx: StageContext):
    if ctx.request is not None:
        exported, ctx.data = steps.export_user_stage(ctx.config, ctx.run, ctx.values["data"], ctx.request.data,
                                                     ctx.request.tags)
        return exported
    trained = ctx.values.get("train")
    model = getattr(trained, "model", trained)
    return steps.export_stage(ctx.config, ctx.run, ctx.run_data(), model)


def _summarise_export(e) -> dict:
    return {"passed": e.audit.passed, "ops": sum(e.audit.op_histogram.values()), "variables": len(e.audit.variables),
            "behaviour": None if e.behaviour is None else e.behaviour.passed}


def _summarise_parity(p) -> dict:
    return {r.artifact: round(r.metric, 4) for r in p.rows} | {"left_out": sorted(p.left_out)}


def _publish(ctx: StageContext):
    train = _json(ctx.run, "train.json") or {}
    if ctx.request is not None:
        parity = _json(ctx.run, "parity.json") or {}
        metrics = {"reference_metric": parity.get("reference_metric"), "metric": parity.get("metric")}
    else:
        metrics = {"test_accuracy": train.get("test_accuracy"), "train": train}
    return steps.publish_stage(ctx.config, ctx.run, ctx.run_data(), ctx.repository, metrics)


def _stored_publish(ctx: StageContext):
    from tfship.pipeline.orchestration.publish import PublishResult

    summary = _json(ctx.run, "summary.json") or {}
    version_dir = parse_location(summary["published"], "summary.json: published")
    manifest = json.loads((version_dir / "manifest.json").read_text()) if isinstance(version_dir, Path) and \
        (version_dir / "manifest.json").is_file() else {}
    return PublishResult(int(summary["version"]), version_dir, manifest)


def _published(run: RunFolder) -> bool:
    summary = _json(run, "summary.json") or {}
    return bool(summary.get("published")) and Path(summary["published"]).is_dir()


CHAIN: tuple[Stage, ...] = (
    Stage("data", (), (), _data, _summarise_data),
    Stage("train", ("data",), ("train.json",), _train, lambda r: r.summary(), _load_trained,
          lambda run: (run.root / "model.keras").is_file() and _json(run, "train.json") is not None, True),
    Stage("export", ("data", "train"), ("audit.json", "export.json", "data.json"), _export, _summarise_export,
          complete=lambda run: (run.artifacts / "saved_model.pb").is_file() and _passed(run, "audit.json"),
          rewrites_artifacts=True),
    Stage("convert", ("export",), ("convert.json",), lambda ctx: steps.convert_stage(ctx.config, ctx.run,
                                                                                      ctx.run_data()),
          lambda c: {o.name: o.status for o in c.outcomes}, complete=lambda run: _json(run, "convert.json") is not None,
          rewrites_artifacts=True),
    Stage("validate", ("convert",), ("parity.json",), lambda ctx: steps.validate_stage(ctx.config, ctx.run,
                                                                                        ctx.run_data()),
          _summarise_parity, complete=lambda run: _passed(run, "parity.json")),
    Stage("serve-check", ("validate",), ("serve_check.json",),
          lambda ctx: steps.serve_check_stage(ctx.config, ctx.run, ctx.run_data()),
          lambda s: {"served": s.served, "left_out": sorted(s.left_out)},
          complete=lambda run: _passed(run, "serve_check.json")),
    Stage("publish", ("serve-check",), (), _publish, lambda p: {"version": p.version, "path": str(p.version_dir)},
          _stored_publish, _published),
)
STAGES = {stage.name: stage for stage in CHAIN}


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
            runner.skip("train", f"--model {ctx.request.model} given: export-only")
            continue
        if stage.name == "data" or rerun or not stage.complete(ctx.run):
            rerun = rerun or stage.name != "data"
            ctx.values[stage.name] = runner(stage.name, lambda s=stage: s.run(ctx), stage.summarise)
        else:
            ctx.values[stage.name] = runner(stage.name, lambda s=stage: s.load(ctx), lambda _: RESUMED)
    return runner.records
