"""`StageContext`: what the stages of one run share, in typed fields (`pipeline.orchestration.chain` runs them).

Checked strictly by `make lint` (basedpyright's `strict` list): each stage record's field holds its own record type
or None, never a dict or a file name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.convert import ConvertResult
from tfship.pipeline.gate.serve_check import ServeCheckResult
from tfship.pipeline.gate.validate import ParityReport
from tfship.pipeline.orchestration.publish import PublishResult
from tfship.pipeline.orchestration.records import ExportRecord, TrainRecord
from tfship.pipeline.orchestration.stages import RunFolder

__all__ = ["StageContext"]


@dataclass
class StageContext:
    """What the stages of one run share.

    config: the run's config; run: its folder; repository: where publish puts the version; request: the
    export-only `--model`/`--data` (None for a built-in run); progress: a rich progress bar for training;
    resume_training: continue training from the latest checkpoint; data: the run's data (splits or the
    user's `EvalData`), set by the stage that loads it or by `chain.run_data` from the run folder; model: the
    Keras model to export (the user's, from the data stage, or the trained one; None: export reads `model.keras`).

    One field per stage record, None until the stage runs or its record is read back from the run folder:
    train (`TrainRecord`), export (`ExportRecord`), convert (`ConvertResult`), validate (`ParityReport`),
    serve_check (`ServeCheckResult`), publish (`PublishResult`, with every artifact's outcome).
    """

    config: PipelineConfig
    run: RunFolder
    repository: Path
    request: Any = None
    progress: Any = None
    resume_training: bool = False
    data: Any = None
    model: Any = None
    train: TrainRecord | None = None
    export: ExportRecord | None = None
    convert: ConvertResult | None = None
    validate: ParityReport | None = None
    serve_check: ServeCheckResult | None = None
    publish: PublishResult | None = None
