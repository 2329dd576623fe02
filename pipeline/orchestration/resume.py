"""`tfship run --resume RUN` and `tfship train --resume [RUN]`: continue a run in its own folder.

A resumed run uses the config stored in the run folder (`config.json`). Stages run in order; a
stage whose outputs are complete and valid is not rerun (its record says so), and once one stage
reruns, every later stage reruns too. Training continues from the latest checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tfship.core.errors import StageError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.orchestration.run_config import RunConfig
from tfship.pipeline.orchestration.stages import RunFolder, StageRecord


def resolve_run(reference: str | Path, runs_dir: Path) -> RunFolder:
    """The run folder named by `reference`: "latest", a folder path, or a run id under `runs_dir`.

    Raises:
        StageError: no such run folder.
    """
    from tfship.pipeline.orchestration.run import latest_run

    if str(reference) == "latest":
        return latest_run(runs_dir)
    for candidate in (Path(reference), Path(runs_dir) / str(reference)):
        if RunConfig.exists(candidate):
            return RunFolder(candidate.resolve())
    raise StageError(f"resume: no run folder {reference!r} (looked for {reference}/config.json and "
                     f"{Path(runs_dir) / str(reference)}/config.json)")


def stored_config(run: RunFolder) -> PipelineConfig:
    """The validated config the run was started with (`<run>/config.json`).

    Raises:
        ConfigError: the stored config is missing or no longer valid.
    """
    return RunConfig.read(run).config


def resume_pipeline(reference: str | Path, config: PipelineConfig, progress=None,
                    on_stage: Callable[[str, StageRecord], None] | None = None):
    """Resume the whole pipeline in run folder `reference` (see the module docstring), built-in or
    export-only alike (the chain: `pipeline.orchestration.chain`).

    Args:
        reference: "latest", a run folder or a run id under `config.run.runs_dir`.
        config: the command line's config; only `run.runs_dir` is used to find the run.

    Returns:
        `pipeline.orchestration.run.PipelineResult`.

    Raises:
        TfshipError: the failing stage's error (its record, report.json and report.md are already written).
    """
    from tfship.pipeline.orchestration.chain import StageContext
    from tfship.pipeline.orchestration.run import execute

    run = resolve_run(reference, config.run.runs_dir)
    stored = RunConfig.read(run)
    config, request = stored.config, stored.export_only
    ctx = StageContext(config, run, config.publish.repository, request=request, progress=progress,
                       resume_training=True)
    return execute(ctx, on_stage, resume=True)
