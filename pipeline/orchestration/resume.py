"""`tfship run --resume RUN` and `tfship train --resume [RUN]`: continue a run in its own folder.

A resumed run uses the config stored in the run folder (`config.json`). Stages run in order; a
stage whose outputs are complete and valid is not rerun (its record says so), and once one stage
reruns, every later stage reruns too. Training continues from the latest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tfship.core.errors import ConfigError, StageError
from tfship.pipeline.config import PipelineConfig
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
        if (candidate / "config.json").is_file():
            return RunFolder(candidate.resolve())
    raise StageError(f"resume: no run folder {reference!r} (looked for {reference}/config.json and "
                     f"{Path(runs_dir) / str(reference)}/config.json)")


def stored_config(run: RunFolder) -> PipelineConfig:
    """The validated config the run was started with (`<run>/config.json`).

    Raises:
        ConfigError: the stored config is missing or no longer valid.
    """
    path = run.root / "config.json"
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
        tree = {k: v for k, v in tree.items() if k in PipelineConfig.model_fields or k == "validate"}
        return PipelineConfig.model_validate(tree)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot resume with this stored config: {err}") from err


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
    from tfship.pipeline.export_only.user_model import ExportOnlyRequest
    from tfship.pipeline.orchestration.chain import StageContext
    from tfship.pipeline.orchestration.run import execute

    run = resolve_run(reference, config.run.runs_dir)
    config = stored_config(run)
    stored = json.loads((run.root / "config.json").read_text(encoding="utf-8"))
    request = None
    if "export_only" in stored:
        stored_request = stored["export_only"]
        request = ExportOnlyRequest(stored_request["model"], Path(stored_request["data"]),
                                    tuple(stored_request.get("tags", ("serve",))),
                                    tuple(stored_request.get("custom_objects", ())))
    ctx = StageContext(config, run, config.publish.repository, request=request, progress=progress,
                       resume_training=True)
    return execute(ctx, on_stage, resume=True)
