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

from pipeline.config import PipelineConfig
from pipeline.data import load_split_arrays
from pipeline.errors import StageError, TfshipError
from pipeline.publish import PublishResult
from pipeline.stages import RunFolder, StageRecord, StageStatus
from pipeline import steps

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

    def _record(self, record: StageRecord) -> None:
        self.records.append(record)
        self.run.record_stages(self.records)
        if self.on_stage is not None:
            self.on_stage(record.name, record)


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
    exported = stage("export", lambda: steps.export_stage(config, run, splits, trained.model),
                     lambda e: {"passed": e.audit.passed, "ops": sum(e.audit.op_histogram.values()),
                                "variables": len(e.audit.variables)})
    converted = stage("convert", lambda: steps.convert_stage(config, run, splits),
                      lambda c: {o.name: o.status for o in c.outcomes})
    parity = stage("validate", lambda: steps.validate_stage(config, run, splits),
                   lambda p: {r.artifact: round(r.accuracy, 2) for r in p.rows})
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
