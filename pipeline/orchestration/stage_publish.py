"""The publish stage: the final verdict on every artifact, the version's manifest (`core.manifest.VersionManifest`)
and the atomic publish of the serve-checked candidate (`pipeline.orchestration.publish.publish_version`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tfship.core.errors import StageError
from tfship.core.manifest import ArtifactEntry, VersionManifest
from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, SignatureCarriage, artifact_kinds
from tfship.pipeline.conversion.convert import ConvertResult
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.export_only.user_model import EvalData
from tfship.pipeline.gate.serve_check import ServeCheckResult
from tfship.pipeline.gate.validate import ParityReport
from tfship.pipeline.orchestration.outcomes import (
    PUBLISHED,
    ArtifactOutcome,
    artifact_outcomes,
    run_status,
    signature_carriers,
)
from tfship.pipeline.orchestration.publish import PublishResult, git_commit, library_versions, publish_version
from tfship.pipeline.orchestration.records import CONVERT, EXPORT, SERVE_CHECK, VALIDATE, ExportRecord
from tfship.pipeline.orchestration.stage_inputs import read_contract, reference_artifact
from tfship.pipeline.orchestration.stages import RunFolder


def signatures_carried(run: RunFolder, outcomes: list, converted: ConvertResult | None = None,
                       parity: ParityReport | None = None) -> dict[str, SignatureCarriage]:
    """{artifact: the signatures its files answer, and why not the others} for every artifact of the run's
    version folder (`pipeline.gate.signatures.signature_carriage`), from the convert and validate stages'
    records (`converted`, `parity`; None: read from the run folder when recorded).
    """
    from tfship.pipeline.gate.signatures import signature_carriage

    converted = converted or CONVERT.load(run)
    parity = parity or VALIDATE.load(run)
    kinds, names = artifact_kinds(), sorted(read_signatures(run.artifacts))
    conversions = {row.name: dict(row.__dict__) for row in (converted.outcomes if converted else ())}
    verdicts = parity.signatures if parity else {}
    carried = {SAVED_MODEL: signature_carriage(reference_artifact(run), names)}
    for outcome in outcomes:
        if outcome.artifact in kinds:
            carried[outcome.artifact] = signature_carriage(kinds[outcome.artifact].artifact(run.artifacts), names,
                                                           conversions.get(outcome.artifact),
                                                           verdicts.get(outcome.artifact))
    return carried


def artifact_entries(outcomes: list[ArtifactOutcome], carried: dict[str, SignatureCarriage],
                     carriers: dict[str, dict[str, Any]]) -> tuple[ArtifactEntry, ...]:
    """Each outcome as the manifest's artifact row: its outcome, its kind's backend and tolerance family
    (`saved_model`, `float32` for the SavedModel) and its signatures: for a published artifact those the
    manifest's `signatures` map (`carriers`, `outcomes.signature_carriers`) lists it under, for a left-out one
    those its files answer (`carried`). Size and sha256 are filled in from the version's files when it is
    published (`VersionManifest.with_files`).
    """
    kinds, rows = artifact_kinds(), []
    for outcome in outcomes:
        kind = kinds.get(outcome.artifact)
        backend, family = (kind.backend, kind.mode) if kind is not None else ("saved_model", "float32")
        if outcome.status == PUBLISHED:
            names = [name for name, row in carriers.items() if outcome.artifact in row["artifacts"]]
        else:
            names = list(carried[outcome.artifact].files) if outcome.artifact in carried else []
        rows.append(ArtifactEntry(**outcome.to_json(), backend=backend, family=str(family),
                                  signatures=tuple(sorted(names))))
    return tuple(rows)


def version_manifest(run: RunFolder, splits: DatasetSplits | EvalData, metrics: dict, outcomes: list[ArtifactOutcome],
                     exported: ExportRecord, converted: ConvertResult | None, parity: ParityReport,
                     served: ServeCheckResult) -> VersionManifest:
    """The version's manifest before publishing (no `files`, `version` or `published_at` yet): every artifact's
    outcome (`artifact_entries`), every signature (`signature_def`), which published artifact carries which
    (`signatures`), and the run's evidence (data, metrics, parity, audit, serve-check, conversions, libraries).
    """
    signatures = read_signatures(run.artifacts)
    carried = signatures_carried(run, outcomes, converted, parity)
    carriers = signature_carriers(sorted(signatures), read_contract(run).name, outcomes, served, carried)
    return VersionManifest(
        status=run_status(outcomes).value,
        artifacts=artifact_entries(outcomes, carried, carriers),
        run=str(run.root),
        git_commit=git_commit(Path(__file__).parent),
        signature_def={name: signature.to_json() for name, signature in sorted(signatures.items())},
        signatures=carriers,
        class_names=tuple(splits.class_names),
        data=splits.summary(),
        metrics=metrics,
        parity=parity.to_json(),
        audit=exported.audit,
        allowed_ops=tuple((exported.audit.get("op_policy") or {}).get("allow_ops", ())),
        serve_check=served.to_json(),
        conversions=converted.to_json() if converted is not None else [],
        libraries=library_versions(),
        files=(),
    )


def publish_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits | EvalData, repository: Path,
                  metrics: dict, exported: ExportRecord | None = None, converted: ConvertResult | None = None,
                  parity: ParityReport | None = None, served: ServeCheckResult | None = None) -> PublishResult:
    """Publish the blessed candidate (the SavedModel and every artifact that passed parity and serve-check)
    with its manifest (`version_manifest`).

    The run's final verdict on each artifact is decided here (`artifact_outcomes`, writing each left-out
    artifact's full reason under `<run>/reasons/`) and returned in `PublishResult.outcomes`; the manifest,
    `summary.json`, the report and `ShipResult` show that one list. The earlier stages' records not handed in
    (None) are read from the run folder.

    Raises:
        StageError: the export, validate or serve-check record is missing or did not pass (nothing published).
    """
    exported, converted = exported or EXPORT.load(run), converted or CONVERT.load(run)
    parity, served = parity or VALIDATE.load(run), served or SERVE_CHECK.load(run)
    for record_file, record in ((VALIDATE, parity), (SERVE_CHECK, served), (EXPORT, exported)):
        if record is None or not record.passed:
            raise StageError(f"publish: {record_file.path(run)} is missing or did not pass; nothing was published")
    assert parity is not None and served is not None and exported is not None  # the loop above raised otherwise
    outcomes = artifact_outcomes(converted, parity, served, config.convert.required, run.root)
    manifest = version_manifest(run, splits, metrics, outcomes, exported, converted, parity, served)
    candidate = run.candidate_repository / config.run.model_name / "1"
    published = publish_version(candidate, repository, config.run.model_name, manifest, config.publish.signing_key)
    return replace(published, outcomes=tuple(outcomes))
