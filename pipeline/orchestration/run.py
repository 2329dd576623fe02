"""`tfship run`: the whole pipeline, stage after stage, stopping at the first failure.

data -> train -> export (+ audit) -> convert -> validate -> serve-check -> publish. Every stage's
record goes to `runs/<run_id>/stages.json`; a failed stage publishes nothing (report.json and report.md
still say what happened). An optional artifact that fails a stage is left out and the run goes on
(`pipeline.orchestration.outcomes`: status `published`, `partial` or `failed`). The outcomes are decided
once, by the publish stage (`PublishResult.outcomes`); `summary.json`, the report and `ShipResult` show them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tfship.core.errors import StageError, TfshipError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.artifacts import allowing_ops
from tfship.pipeline.export_only.user_model import ExportOnlyRequest
from tfship.pipeline.orchestration import steps
from tfship.pipeline.orchestration.chain import (
    STAGES,
    StageContext,
    read_inputs,
    read_records,
    run_chain,
    stored_run_config,
)
from tfship.pipeline.orchestration.outcomes import RunStatus, run_status, signature_carriers, status_line
from tfship.pipeline.orchestration.publish import PublishResult
from tfship.pipeline.orchestration.records import read_json
from tfship.pipeline.orchestration.run_config import EXPORT_ONLY, RunConfig
from tfship.pipeline.orchestration.stages import RunFolder, StageRecord, StageStatus

T = TypeVar("T")
STAGE_NAMES = tuple(STAGES)


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


def _forget(run: RunFolder, names: tuple[str, ...]) -> None:
    for stage_name in names:
        for file_name in STAGES[stage_name].outputs:
            (run.root / file_name).unlink(missing_ok=True)


def run_single_stage(ctx: StageContext, name: str) -> Any:
    """Run one stage alone in an existing run folder (`tfship convert`, `validate`, ...).

    The stage comes from the chain (`pipeline.orchestration.chain.STAGES`); the records of its `inputs` are
    read from the run folder into `ctx` (those `ctx` does not hold yet), and its own record is returned (and
    kept in `ctx`). The stage's own record file is removed first, so a failure can never leave an earlier `ok` behind;
    `stages.json` keeps the other stages' records and gets this stage's new one (`ok`, or `failed` with the
    reason). When the stage fails, or when it rewrote artifacts (train, export, convert), every later
    stage's record file is removed and its record marked `skipped` (outdated).

    Raises:
        TfshipError: the stage's error (its `failed` record is already written).
    """
    run, stage = ctx.run, STAGES[name]
    later = STAGE_NAMES[STAGE_NAMES.index(name) + 1:]
    _forget(run, (name,))
    if stage.field is not None:
        setattr(ctx, stage.field, None)
    read_inputs(ctx, stage)
    stored = _read(run, "stages.json") or []
    records = [StageRecord(r["name"], StageStatus(r["status"]), r["seconds"], r["reason"], r["summary"])
               for r in stored if r["name"] != name]
    runner = StageRunner(run)
    runner.records = [r for r in records if r.name not in later]
    try:
        value = runner(name, lambda: stage.perform(ctx), stage.summarise)
    except TfshipError:
        _forget(run, later)
        raise
    if stage.rewrites_artifacts:
        _forget(run, later)
        for stage_name in later:
            runner.skip(stage_name, f"outdated: '{name}' ran again alone; run `tfship run --resume`")
    else:
        runner.records += [r for r in records if r.name in later]
        run.record_stages(runner.records)
    return value


def _read(run: RunFolder, name: str):
    try:
        return read_json(run, name)
    except (OSError, ValueError):
        return None


def run_summary(ctx: StageContext, extra: dict[str, Any]) -> dict[str, Any]:
    """The run's summary from the context's stage records: status, every artifact's outcome (the publish
    stage's `PublishResult.outcomes`; none when nothing was published), parity, conversions.

    `status` is `published`, `partial` (optional artifacts left out) or `failed` (nothing published);
    `signatures`: which published artifact carries which signature (`outcomes.signature_carriers`).
    """
    run, published = ctx.run, ctx.publish
    outcomes = list(published.outcomes) if published else []
    served = ctx.serve_check
    signatures = list(ctx.export.signatures) if ctx.export is not None else []
    return {"status": (run_status(outcomes) if published else RunStatus.FAILED).value,
            "status_line": status_line(outcomes) if published else "status: failed (nothing published)",
            "run": str(run.root), "published": str(published.version_dir) if published else None,
            "version": published.version if published else None,
            "audit_passed": ctx.export is not None and ctx.export.passed,
            "signatures": signature_carriers(signatures, "serving_default", outcomes, served,
                                             steps.signatures_carried(run, outcomes, ctx.convert, ctx.validate))
            if published else {},
            "artifacts": [o.to_json() for o in outcomes],
            "conversions": ctx.convert.to_json() if ctx.convert is not None else [],
            "parity": ctx.validate.to_json() if ctx.validate is not None else None,
            "serve_check": served.served if served is not None else [],
            "convert_memory": ctx.convert.memory if ctx.convert is not None else None} | extra


def finish_run(ctx: StageContext, records: list[StageRecord], extra: dict[str, Any]) -> PipelineResult:
    """Write `summary.json` for a run that published (`ctx.publish`), and return its result."""
    summary = run_summary(ctx, extra)
    ctx.run.write_json("summary.json", summary)
    return PipelineResult(ctx.run, tuple(records), ctx.publish, summary)


@contextmanager
def reported_failure(ctx: StageContext, extra: dict[str, Any]):
    """On a `TfshipError`, write `report.json` and `report.md` (status `failed`, the stage records so far and
    the error), then re-raise it. The failing stage's record, written before it raised, is read from the run
    folder (as is any other the context does not hold).
    """
    try:
        yield
    except TfshipError as err:
        from tfship.pipeline.orchestration.report import write_report

        read_records(ctx)
        ctx.publish = None
        stages = _read(ctx.run, "stages.json") or []
        write_report(ctx.run, run_summary(ctx, extra | {"error": f"{type(err).__name__}: {err}", "stages": stages}))
        raise


def _extras(ctx: StageContext) -> dict[str, Any]:
    stored = stored_run_config(ctx.run)
    if stored is not None and stored.export_only is not None:
        contract = steps.read_contract(ctx.run).to_json() if ctx.export is not None else None
        return {"train": None, "export_only": stored.to_json()[EXPORT_ONLY], "contract": contract}
    return {"train": dict(ctx.train.summary) if ctx.train is not None else None}


def execute(ctx: StageContext, on_stage: Callable[[str, StageRecord], None] | None = None,
            resume: bool = False) -> PipelineResult:
    """Run the chain (`pipeline.orchestration.chain.run_chain`) in `ctx.run` and write `summary.json`; on a
    failure write report.json and report.md, then re-raise.

    Raises:
        TfshipError: the failing stage's error (its record, report.json and report.md are already written).
    """
    stage = StageRunner(ctx.run, on_stage)
    extra = {"resumed": True} if resume else {}
    with reported_failure(ctx, extra), allowing_ops(ctx.config.export.allow_ops):
        run_chain(ctx, stage, resume)
    return finish_run(ctx, stage.records, _extras(ctx) | extra)


def run_export_only(config: PipelineConfig, repository: Path, request: ExportOnlyRequest,
                    on_stage: Callable[[str, StageRecord], None] | None = None) -> PipelineResult:
    """`tfship run --model ... --data ...`: load, export (+ audit, behaviour), convert, validate,
    serve-check and publish a user's model; training is skipped (recorded as such).

    Raises:
        TfshipError: the failing stage's error (its record, report.json and report.md are already written).
    """
    run = RunFolder.create(config.run.runs_dir, config.run.model_name)
    RunConfig(config, request).write(run)
    return execute(StageContext(config, run, repository, request=request), on_stage)


def run_pipeline(config: PipelineConfig, repository: Path, progress=None,
                 on_stage: Callable[[str, StageRecord], None] | None = None) -> PipelineResult:
    """Run every stage on a new run folder and publish into `repository`.

    Raises:
        TfshipError: the failing stage's error (its record, report.json and report.md are already written).
    """
    run = new_training_run(config)
    return execute(StageContext(config, run, repository, progress=progress), on_stage)


def new_training_run(config: PipelineConfig) -> RunFolder:
    """A new run folder for a run that trains, holding its `config.json`; a config that cannot train is refused
    first, so it leaves no run folder behind.

    Raises:
        ConfigError: `pipeline.training.input_specs.check_trainable`'s one line naming the key and the value.
    """
    from tfship.pipeline.training.input_specs import check_trainable

    check_trainable(config)
    run = RunFolder.create(config.run.runs_dir, config.run.model_name)
    RunConfig(config).write(run)
    return run


def latest_run(runs_dir: Path) -> RunFolder:
    """The most recent run folder under `runs_dir` (dot folders, such as the API's `.inputs`, are not runs).

    Raises:
        StageError: when there is none.
    """
    folder = Path(runs_dir)
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) if folder.is_dir() else []
    if not runs:
        raise StageError(f"no run folder under {runs_dir}; run `tfship train` or `tfship run` first")
    return RunFolder(runs[-1].resolve())
