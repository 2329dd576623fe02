"""`tfship run`: the whole pipeline, stage after stage, stopping at the first failure.

data -> train -> export (+ audit) -> convert -> validate -> serve-check -> publish. Every stage's
record goes to `runs/<run_id>/stages.json`; a failed stage publishes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from core.errors import StageError, TfshipError
from pipeline.config import PipelineConfig
from pipeline.data.splits import load_split_arrays
from pipeline.export_only.user_model import ExportOnlyRequest
from pipeline.orchestration import steps
from pipeline.orchestration.publish import PublishResult
from pipeline.orchestration.stages import RunFolder, StageRecord, StageStatus

T = TypeVar("T")
STAGE_NAMES = ("data", "train", "export", "convert", "validate", "serve-check", "publish")


@dataclass(frozen=True)
class PipelineResult:
    """What a full run produced: its folder, stage records and the published version."""

    run: RunFolder
    records: tuple[StageRecord, ...]
    published: PublishResult | None
    summary: dict[str, Any]


class StageRunner:
    """Times each stage, records ok/failed, and stops the run on the first failure."""

    def __init__(self, run: RunFolder, on_stage: Callable[[str, StageRecord], None] | None = None):
        self.run = run
        self.records: list[StageRecord] = []
        self.on_stage = on_stage

    def __call__(self, name: str, function: Callable[[], T], summarise: Callable[[T], dict] = lambda _: {}) -> T:
        started = time.perf_counter()
        try:
            value = function()
        except TfshipError as err:
            self._record(StageRecord(name, StageStatus.FAILED, time.perf_counter() - started, str(err)))
            for later in STAGE_NAMES[STAGE_NAMES.index(name) + 1:] if name in STAGE_NAMES else ():
                self._record(StageRecord(later, StageStatus.SKIPPED, 0.0, f"'{name}' failed"))
            raise
        self._record(StageRecord(name, StageStatus.OK, time.perf_counter() - started, "", summarise(value)))
        return value

    def skip(self, name: str, reason: str) -> None:
        """Record `name` as skipped on purpose (e.g. training in export-only mode)."""
        self._record(StageRecord(name, StageStatus.SKIPPED, 0.0, reason))

    def _record(self, record: StageRecord) -> None:
        self.records.append(record)
        self.run.record_stages(self.records)
        if self.on_stage is not None:
            self.on_stage(record.name, record)


def _summarise_export(e) -> dict:
    return {"passed": e.audit.passed, "ops": sum(e.audit.op_histogram.values()), "variables": len(e.audit.variables),
            "behaviour": None if e.behaviour is None else e.behaviour.passed}


def _summarise_parity(p) -> dict:
    return {r.artifact: round(r.metric, 4) for r in p.rows}


def run_export_only(config: PipelineConfig, repository: Path, request: ExportOnlyRequest,
                    on_stage: Callable[[str, StageRecord], None] | None = None) -> PipelineResult:
    """`tfship run --model ... --data ...`: load, export (+ audit, behaviour), convert, validate,
    serve-check and publish a user's model; training is skipped (recorded as such).

    Raises:
        TfshipError: the failing stage's error (its record is already written).
    """
    from pipeline.export_only.user_model import load_user_model

    run = RunFolder.create(config.run.runs_dir, config.run.model_name)
    run.write_json("config.json", config.model_dump(mode="json", by_alias=True)
                   | {"export_only": {"model": request.model, "data": str(request.data)}})
    stage = StageRunner(run, on_stage)
    model = stage("data", lambda: load_user_model(request.model, request.custom_objects),
                  lambda m: {"model": request.model, "kind": type(m).__name__})
    stage.skip("train", f"--model {request.model} given: export-only")
    exported, data = stage("export", lambda: steps.export_user_stage(config, run, model, request.data, request.tags),
                           lambda pair: _summarise_export(pair[0]) | {"data": pair[1].summary()})
    converted = stage("convert", lambda: steps.convert_stage(config, run, data),
                      lambda c: {o.name: o.status for o in c.outcomes})
    parity = stage("validate", lambda: steps.validate_stage(config, run, data), _summarise_parity)
    checked = stage("serve-check", lambda: steps.serve_check_stage(config, run, data), lambda s: s.backends)
    metrics = {"reference_metric": parity.reference_metric, "metric": parity.metric}
    published = stage("publish", lambda: steps.publish_stage(config, run, data, repository, metrics),
                      lambda p: {"version": p.version, "path": str(p.version_dir)})
    summary = {"run": str(run.root), "published": str(published.version_dir), "version": published.version,
               "train": None, "export_only": {"model": request.model, "data": str(request.data)},
               "audit_passed": exported.audit.passed, "contract": exported.contract.to_json(),
               "conversions": converted.to_json(), "parity": parity.to_json(), "serve_check": checked.backends}
    run.write_json("summary.json", summary)
    return PipelineResult(run, tuple(stage.records), published, summary)


def run_pipeline(config: PipelineConfig, repository: Path, progress=None,
                 on_stage: Callable[[str, StageRecord], None] | None = None) -> PipelineResult:
    """Run every stage on a new run folder and publish into `repository`.

    Raises:
        TfshipError: the failing stage's error (its record is already written).
    """
    run = RunFolder.create(config.run.runs_dir, config.run.model_name)
    run.write_json("config.json", config.model_dump(mode="json", by_alias=True))
    stage = StageRunner(run, on_stage)
    splits = stage("data", lambda: load_split_arrays(config.data, config.run.seed), lambda s: s.summary())
    trained = stage("train", lambda: steps.train_step_stage(config, run, splits, progress), lambda r: r.summary())
    exported = stage("export", lambda: steps.export_stage(config, run, splits, trained.model), _summarise_export)
    converted = stage("convert", lambda: steps.convert_stage(config, run, splits),
                      lambda c: {o.name: o.status for o in c.outcomes})
    parity = stage("validate", lambda: steps.validate_stage(config, run, splits),
                   _summarise_parity)
    checked = stage("serve-check", lambda: steps.serve_check_stage(config, run, splits), lambda s: s.backends)
    metrics = {"test_accuracy": trained.test_accuracy, "train": trained.summary()}
    published = stage("publish", lambda: steps.publish_stage(config, run, splits, repository, metrics),
                      lambda p: {"version": p.version, "path": str(p.version_dir)})
    summary = {"run": str(run.root), "published": str(published.version_dir), "version": published.version,
               "train": trained.summary(), "audit_passed": exported.audit.passed,
               "conversions": converted.to_json(), "parity": parity.to_json(), "serve_check": checked.backends}
    run.write_json("summary.json", summary)
    return PipelineResult(run, tuple(stage.records), published, summary)


def latest_run(runs_dir: Path) -> RunFolder:
    """The most recent run folder under `runs_dir`.

    Raises:
        StageError: when there is none.
    """
    runs = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()) if Path(runs_dir).is_dir() else []
    if not runs:
        raise StageError(f"no run folder under {runs_dir}; run `tfship train` or `tfship run` first")
    return RunFolder(runs[-1].resolve())
