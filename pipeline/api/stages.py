"""The pipeline's stages one at a time: `tfship.train()`, then `tfship.export(run)`, `convert`, `validate` and
`publish` (serve-check, then publish) on that run folder, as `tfship train` / `tfship export` ... do.

Each returns a `StageResult` (the stage's value and its summary as a table). Given a run folder and no
`config` or settings, a stage runs with the config that run was made with (`<run>/config.json`). A stage
run alone replaces its own record in the run folder; when it rewrote artifacts, the later stages' records
are marked outdated (`pipeline.orchestration.run.run_single_stage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfship.core.locations import parse_location
from tfship.pipeline.api.results import ShipResult, StageResult
from tfship.pipeline.api.ship import configure
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.orchestration.chain import StageContext
from tfship.pipeline.orchestration.resume import stored_config
from tfship.pipeline.orchestration.run import latest_run, new_training_run, run_single_stage
from tfship.pipeline.orchestration.stages import RunFolder


def stage_fields(name: str, value: Any) -> dict[str, Any]:
    """A stage's value as JSON-ready fields (what `tfship <stage>` prints)."""
    if name == "train":
        return dict(value.summary)
    if name == "export":
        return dict(value.audit)
    if name == "publish":
        checked, published = value
        return {"serve_check": checked.served, "left_out": checked.left_out, "version": published.version,
                "path": str(published.version_dir), "status": published.manifest.status}
    return value.to_json() if hasattr(value, "to_json") else {str(i): item for i, item in enumerate(value)}


def run_stage(config: PipelineConfig, name: str, run: RunFolder | None = None, progress=None,
              resume_training: bool = False) -> StageResult:
    """Run stage `name` alone: `train` in a new run folder (or `run`, resuming from its checkpoint with
    `resume_training`), any other stage in `run` (default: the latest under `run.runs_dir`). `publish` runs
    the serve-check first. `tfship <stage>` ends here too.

    Raises:
        StageError: no run folder, or the run lacks what the stage needs; TfshipError: the stage failed (its
        `failed` record is written).
    """
    if name == "train":
        if run is None:
            run = new_training_run(config)
        ctx = StageContext(config, run, config.publish.repository, progress=progress, resume_training=resume_training)
        value = run_single_stage(ctx, "train")
    else:
        run = run or latest_run(config.run.runs_dir)
        ctx = StageContext(config, run, config.publish.repository)
        if name == "publish":
            value = (run_single_stage(ctx, "serve-check"), run_single_stage(ctx, "publish"))
        else:
            value = run_single_stage(ctx, name)
    return StageResult(name, run.root, value, stage_fields(name, value))


def _folder(run: Path | str | ShipResult | StageResult | None) -> RunFolder | None:
    if run is None:
        return None
    return RunFolder(Path(run.run if isinstance(run, (ShipResult, StageResult)) else run).resolve())


def _stage(name: str, run, config: Path | str | None, repository: Path | str | None,
           settings: Mapping[str, Mapping[str, Any]]) -> StageResult:
    """A run folder given without a config or settings runs with the config it was made with."""
    folder = _folder(run)
    if folder is not None and config is None and not settings:
        resolved = stored_config(folder)
        if repository is not None:
            resolved = resolved.model_copy(update={"publish": resolved.publish.model_copy(
                update={"repository": parse_location(repository, "repository")})})
        return run_stage(resolved, name, folder)
    overrides = {"publish.repository": str(repository)} if repository is not None else {}
    return run_stage(configure(config, overrides, **settings), name, folder)


def train(config: Path | str | None = None, **settings: Mapping[str, Any]) -> StageResult:
    """Train the config's model into a new run folder (`StageResult.run`); settings as for `tfship.ship`."""
    return _stage("train", None, config, None, settings)


def export(run_folder=None, *, config: Path | str | None = None, **settings: Mapping[str, Any]) -> StageResult:
    """Export and audit the run's trained model (`run_folder`: a path, a `ShipResult` / `StageResult`, or None
    for the latest under the config's `run.runs_dir`).
    """
    return _stage("export", run_folder, config, None, settings)


def convert(run_folder=None, *, config: Path | str | None = None, **settings: Mapping[str, Any]) -> StageResult:
    """Convert the run's SavedModel to ONNX and the TFLite modes (and TF.js when enabled)."""
    return _stage("convert", run_folder, config, None, settings)


def validate(run_folder=None, *, config: Path | str | None = None, **settings: Mapping[str, Any]) -> StageResult:
    """The parity gate on the run's artifacts; raises the gate's error when a required artifact misses."""
    return _stage("validate", run_folder, config, None, settings)


def publish(run_folder=None, *, repository: Path | str | None = None, config: Path | str | None = None,
            **settings: Mapping[str, Any]) -> StageResult:
    """Serve-check the run's artifacts with our server, then publish the next version into `repository`."""
    return _stage("publish", run_folder, config, repository, settings)
