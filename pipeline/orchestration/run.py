"""`tfship run`: the whole pipeline, stage after stage, stopping at the first failure.

data -> train -> export (+ audit) -> convert -> validate -> serve-check -> publish. Every stage's
record goes to `runs/<run_id>/stages.json`; a failed stage publishes nothing (report.json and report.md
still say what happened). An optional artifact that fails a stage is left out and the run goes on
(`pipeline.orchestration.outcomes`: status `published`, `partial` or `failed`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pipeline.config import PipelineConfig
from pipeline.data.splits import load_split_arrays
from core.errors import StageError, TfshipError
from pipeline.orchestration.outcomes import RunStatus, artifact_outcomes, run_status, status_line
from pipeline.orchestration.publish import PublishResult
from pipeline.orchestration.stages import RunFolder, StageRecord, StageStatus
from pipeline.export_only.user_model import ExportOnlyRequest
from pipeline.orchestration import steps

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


STAGE_RECORDS = {"train": ("train.json",), "export": ("audit.json",), "convert": ("convert.json",),
                 "validate": ("parity.json",), "serve-check": ("serve_check.json",), "publish": ()}
ARTIFACT_STAGES = ("train", "export", "convert")  # stages that rewrite what later stages judged


def _forget(run: RunFolder, names: tuple[str, ...]) -> None:
    for stage_name in names:
        for file_name in STAGE_RECORDS.get(stage_name, ()):
            (run.root / file_name).unlink(missing_ok=True)


def run_single_stage(run: RunFolder, name: str, function: Callable[[], T],
                     summarise: Callable[[T], dict] = lambda _: {}) -> T:
    """Run one stage alone in an existing run folder (`tfship convert`, `validate`, ...).

    The stage's own record file is removed first, so a failure can never leave an earlier `ok` behind;
    `stages.json` keeps the other stages' records and gets this stage's new one (`ok`, or `failed` with the
    reason). When the stage fails, or when it rewrote artifacts (train, export, convert), every later
    stage's record file is removed and its record marked `skipped` (outdated).

    Raises:
        TfshipError: the stage's error (its `failed` record is already written).
    """
    later = STAGE_NAMES[STAGE_NAMES.index(name) + 1:]
    _forget(run, (name,))
    stored = json.loads((run.root / "stages.json").read_text()) if (run.root / "stages.json").is_file() else []
    records = [StageRecord(r["name"], StageStatus(r["status"]), r["seconds"], r["reason"], r["summary"])
               for r in stored if r["name"] != name]
    runner = StageRunner(run)
    runner.records = [r for r in records if r.name not in later]
    try:
        value = runner(name, function, summarise)
    except TfshipError:
        _forget(run, later)
        raise
    if name in ARTIFACT_STAGES:
        _forget(run, later)
        for stage_name in later:
            runner.skip(stage_name, f"outdated: '{name}' ran again alone; run `tfship run --resume`")
    else:
        runner.records += [r for r in records if r.name in later]
        run.record_stages(runner.records)
    return value


def _summarise_export(e) -> dict:
    return {"passed": e.audit.passed, "ops": sum(e.audit.op_histogram.values()), "variables": len(e.audit.variables),
            "behaviour": None if e.behaviour is None else e.behaviour.passed}


def _summarise_parity(p) -> dict:
    return {r.artifact: round(r.metric, 4) for r in p.rows} | {"left_out": sorted(p.left_out)}


def _read(run: RunFolder, name: str):
    path = run.root / name
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def run_summary(config: PipelineConfig, run: RunFolder, published: PublishResult | None,
                extra: dict[str, Any]) -> dict[str, Any]:
    """The run's summary from its stage records: status, every artifact's outcome, parity, conversions.

    `status` is `published`, `partial` (optional artifacts left out) or `failed` (nothing published).
    """
    conversions, parity, served = _read(run, "convert.json") or [], _read(run, "parity.json"), \
        _read(run, "serve_check.json")
    outcomes = artifact_outcomes(conversions, parity, served, config.convert.required) if published else []
    audit = _read(run, "audit.json") or {}
    return {"status": (run_status(outcomes) if published else RunStatus.FAILED).value,
            "status_line": status_line(outcomes) if published else "status: failed (nothing published)",
            "run": str(run.root), "published": str(published.version_dir) if published else None,
            "version": published.version if published else None, "audit_passed": bool(audit.get("passed")),
            "artifacts": [o.to_json() for o in outcomes], "conversions": conversions, "parity": parity,
            "serve_check": [n for n, r in (served or {}).get("artifacts", {}).items() if r["passed"]]} | extra


def finish_run(config: PipelineConfig, run: RunFolder, records: list[StageRecord], published: PublishResult,
               extra: dict[str, Any]) -> PipelineResult:
    """Write `summary.json` for a run that published, and return its result."""
    summary = run_summary(config, run, published, extra)
    run.write_json("summary.json", summary)
    return PipelineResult(run, tuple(records), published, summary)


@contextmanager
def reported_failure(config: PipelineConfig, run: RunFolder, extra: dict[str, Any]):
    """On a `TfshipError`, write `report.json` and `report.md` (status `failed`, the stage records so far and
    the error), then re-raise it."""
    try:
        yield
    except TfshipError as err:
        from pipeline.orchestration.report import write_report

        stages = _read(run, "stages.json") or []
        write_report(run, run_summary(config, run, None, extra | {"error": f"{type(err).__name__}: {err}",
                                                                 "stages": stages}))
        raise


def run_export_only(config: PipelineConfig, repository: Path, request: ExportOnlyRequest,
                    on_stage: Callable[[str, StageRecord], None] | None = None) -> PipelineResult:
    """`tfship run --model ... --data ...`: load, export (+ audit, behaviour), convert, validate,
    serve-check and publish a user's model; training is skipped (recorded as such).

    Raises:
        TfshipError: the failing stage's error (its record, report.json and report.md are already written).
    """
    from pipeline.export_only.user_model import load_user_model

    run = RunFolder.create(config.run.runs_dir, config.run.model_name)
    run.write_json("config.json", config.model_dump(mode="json", by_alias=True)
                   | {"export_only": {"model": request.model, "data": str(Path(request.data).resolve())}})
    stage = StageRunner(run, on_stage)
    extra = {"train": None, "export_only": {"model": request.model, "data": str(request.data)}}
    with reported_failure(config, run, extra):
        model = stage("data", lambda: load_user_model(request.model),
                      lambda m: {"model": request.model, "kind": type(m).__name__})
        stage.skip("train", f"--model {request.model} given: export-only")
        exported, data = stage("export", lambda: steps.export_user_stage(config, run, model, request.data),
                               lambda pair: _summarise_export(pair[0]) | {"data": pair[1].summary()})
        stage("convert", lambda: steps.convert_stage(config, run, data),
              lambda c: {o.name: o.status for o in c.outcomes})
        parity = stage("validate", lambda: steps.validate_stage(config, run, data), _summarise_parity)
        stage("serve-check", lambda: steps.serve_check_stage(config, run, data), lambda s: s.served)
        metrics = {"reference_metric": parity.reference_metric, "metric": parity.metric}
        published = stage("publish", lambda: steps.publish_stage(config, run, data, repository, metrics),
                          lambda p: {"version": p.version, "path": str(p.version_dir)})
    return finish_run(config, run, stage.records, published, extra | {"contract": exported.contract.to_json()})


def run_pipeline(config: PipelineConfig, repository: Path, progress=None,
                 on_stage: Callable[[str, StageRecord], None] | None = None) -> PipelineResult:
    """Run every stage on a new run folder and publish into `repository`.

    Raises:
        TfshipError: the failing stage's error (its record, report.json and report.md are already written).
    """
    run = RunFolder.create(config.run.runs_dir, config.run.model_name)
    run.write_json("config.json", config.model_dump(mode="json", by_alias=True))
    stage = StageRunner(run, on_stage)
    with reported_failure(config, run, {"train": None}):
        splits = stage("data", lambda: load_split_arrays(config.data, config.run.seed), lambda s: s.summary())
        trained = stage("train", lambda: steps.train_step_stage(config, run, splits, progress), lambda r: r.summary())
        stage("export", lambda: steps.export_stage(config, run, splits, trained.model), _summarise_export)
        stage("convert", lambda: steps.convert_stage(config, run, splits),
              lambda c: {o.name: o.status for o in c.outcomes})
        stage("validate", lambda: steps.validate_stage(config, run, splits), _summarise_parity)
        stage("serve-check", lambda: steps.serve_check_stage(config, run, splits), lambda s: s.served)
        metrics = {"test_accuracy": trained.test_accuracy, "train": trained.summary()}
        published = stage("publish", lambda: steps.publish_stage(config, run, splits, repository, metrics),
                          lambda p: {"version": p.version, "path": str(p.version_dir)})
    return finish_run(config, run, stage.records, published, {"train": trained.summary()})


def latest_run(runs_dir: Path) -> RunFolder:
    """The most recent run folder under `runs_dir`.

    Raises:
        StageError: when there is none.
    """
    runs = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()) if Path(runs_dir).is_dir() else []
    if not runs:
        raise StageError(f"no run folder under {runs_dir}; run `tfship train` or `tfship run` first")
    return RunFolder(runs[-1].resolve())
