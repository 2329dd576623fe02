"""`tfship run --resume RUN` and `tfship train --resume [RUN]`: continue a run in its own folder.

A resumed run uses the config stored in the run folder (`config.json`). Stages run in order; a
stage whose outputs are complete and valid is not rerun (its record says so), and once one stage
reruns, every later stage reruns too. Training continues from the latest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from core.errors import ConfigError, StageError
from pipeline.config import PipelineConfig
from pipeline.orchestration.stages import RunFolder, StageRecord

RESUMED = {"skipped": "outputs complete and valid in the resumed run; not rerun"}


def resolve_run(reference: str | Path, runs_dir: Path) -> RunFolder:
    """The run folder named by `reference`: "latest", a folder path, or a run id under `runs_dir`.

    Raises:
        StageError: no such run folder.
    """
    from pipeline.orchestration.run import latest_run

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


def _passed(run: RunFolder, name: str) -> bool:
    try:
        return bool(json.loads((run.root / name).read_text())["passed"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _readable(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def stage_complete(run: RunFolder, name: str) -> bool:
    """Whether stage `name` of `run` left complete, valid outputs (files present, JSON readable, checks passed)."""
    checks = {
        "train": lambda: (run.root / "model.keras").is_file() and _readable(run.root / "train.json"),
        "export": lambda: (run.artifacts / "saved_model.pb").is_file() and _passed(run, "audit.json"),
        "convert": lambda: _readable(run.root / "convert.json"),
        "validate": lambda: _passed(run, "parity.json"),
        "serve-check": lambda: _passed(run, "serve_check.json"),
        "publish": lambda: _readable(run.root / "summary.json")
        and Path(json.loads((run.root / "summary.json").read_text()).get("published", "/nonexistent")).is_dir(),
    }
    return checks[name]()


def resume_pipeline(reference: str | Path, config: PipelineConfig, progress=None,
                    on_stage: Callable[[str, StageRecord], None] | None = None):
    """Resume the whole pipeline in run folder `reference` (see the module docstring).

    Args:
        reference: "latest", a run folder or a run id under `config.run.runs_dir`.
        config: the command line's config; only `run.runs_dir` is used to find the run.

    Returns:
        `pipeline.orchestration.run.PipelineResult`.

    Raises:
        TfshipError: the failing stage's error (its record is already written).
    """
    import keras

    from pipeline.data.splits import load_split_arrays
    from pipeline.orchestration import steps
    from pipeline.orchestration.publish import PublishResult
    from pipeline.orchestration.run import PipelineResult, StageRunner

    run = resolve_run(reference, config.run.runs_dir)
    config = stored_config(run)
    stage = StageRunner(run, on_stage)
    splits = stage("data", lambda: load_split_arrays(config.data, config.run.seed), lambda s: s.summary())
    rerun = False

    def step(name: str, function: Callable[[], object], load: Callable[[], object] = lambda: None):
        nonlocal rerun
        if not rerun and stage_complete(run, name):
            return stage(name, load, lambda _: RESUMED)
        rerun = True
        return stage(name, function)

    has_checkpoint = (run.checkpoints / "checkpoint").is_file()
    trained = step("train", lambda: steps.train_step_stage(config, run, splits, progress, resume=has_checkpoint).model,
                   lambda: keras.models.load_model(run.root / "model.keras"))
    step("export", lambda: steps.export_stage(config, run, splits, trained))
    step("convert", lambda: steps.convert_stage(config, run, splits))
    step("validate", lambda: steps.validate_stage(config, run, splits))
    step("serve-check", lambda: steps.serve_check_stage(config, run, splits))
    train = json.loads((run.root / "train.json").read_text())
    metrics = {"test_accuracy": train.get("test_accuracy"), "train": train}
    published = step("publish", lambda: steps.publish_stage(config, run, splits, config.publish.repository, metrics),
                     lambda: _stored_publish(run, PublishResult))
    summary = {"run": str(run.root), "published": str(published.version_dir), "version": published.version,
               "train": train, "audit_passed": _passed(run, "audit.json"),
               "conversions": json.loads((run.root / "convert.json").read_text()),
               "parity": json.loads((run.root / "parity.json").read_text()),
               "serve_check": json.loads((run.root / "serve_check.json").read_text()).get("backends", []),
               "resumed": True}
    run.write_json("summary.json", summary)
    return PipelineResult(run, tuple(stage.records), published, summary)


def _stored_publish(run: RunFolder, result_type):
    summary = json.loads((run.root / "summary.json").read_text())
    version_dir = Path(summary["published"])
    manifest_path = version_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    return result_type(int(summary["version"]), version_dir, manifest)
