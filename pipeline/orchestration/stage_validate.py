"""The validate stage: the parity gate on every produced artifact and on each one's other signatures."""

from __future__ import annotations

from tfship.core.errors import ParityError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.convert import ConvertResult
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.export_only.user_model import EvalData
from tfship.pipeline.gate.validate import ParityReport, raise_if_failed, validate_artifacts
from tfship.pipeline.orchestration.records import VALIDATE
from tfship.pipeline.orchestration.stage_inputs import as_eval_data, produced_artifacts, read_contract
from tfship.pipeline.orchestration.stages import RunFolder


def validate_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits | EvalData,
                   converted: ConvertResult | None = None) -> ParityReport:
    """Run the held-out data through every produced artifact (`converted`: the convert stage's record; None:
    read from the run folder) and through each artifact's other signatures; write the record (`parity.json`);
    fail when the SavedModel or a required artifact misses (the others are left out).

    Returns:
        The parity report with the other signatures' verdicts (`ParityReport.with_other_signatures`).

    Raises:
        ParityError: the SavedModel or a required artifact missed.
    """
    from tfship.pipeline.gate.signatures import validate_other_signatures

    contract = read_contract(run)
    reference, candidates = produced_artifacts(run, converted)
    data = as_eval_data(config, contract, splits)
    report = validate_artifacts(reference, candidates, contract, data.inputs, data.labels, config.parity,
                                config.convert.required)
    others = validate_other_signatures(reference, candidates, data.inputs, config.parity)
    judged = VALIDATE.save(run, report.with_other_signatures(others.verdicts, others.noise, others.implementation))
    raise_if_failed(report)
    if not judged.passed:
        raise ParityError("parity gate failed: " + " | ".join(
            f"{r.artifact}: {r.reason}" for r in judged.rows if not r.passed and r.artifact in config.convert.required))
    return judged
