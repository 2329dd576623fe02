"""The convert stage: the run's SavedModel into every enabled artifact kind (`pipeline.conversion.convert`)."""

from __future__ import annotations

from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.artifacts import check_required
from tfship.pipeline.conversion.convert import ConvertResult, convert_artifacts, raise_if_required_missing
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.export_only.user_model import EvalData
from tfship.pipeline.orchestration.records import CONVERT, EXPORT, ExportRecord
from tfship.pipeline.orchestration.stage_inputs import as_eval_data, read_contract
from tfship.pipeline.orchestration.stages import RunFolder


def convert_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits | EvalData,
                  exported: ExportRecord | None = None) -> ConvertResult:
    """Convert the run's SavedModel into every enabled artifact kind (see pipeline.conversion.convert); the record
    (`convert.json`: outcomes; `convert_memory.json`: the memory budget and each conversion's peak) is written
    before a required artifact that was not produced fails the stage.

    exported: the export stage's record (None: read from the run folder), for the TFLite recipes' sources.

    Raises:
        ConversionError: a kind in `convert.required` was not produced.
    """
    check_required(config.convert)
    contract = read_contract(run)
    data = as_eval_data(config, contract, splits)
    sample = {name: value[:8] for name, value in data.inputs.items()}
    exported = exported or EXPORT.load(run)
    result = convert_artifacts(run.artifacts, contract, config.convert, data.calibration, sample,
                               exported.tflite_sources() if exported is not None else ExportRecord({}).tflite_sources())
    CONVERT.save(run, result)
    return raise_if_required_missing(result, config.convert.required)
