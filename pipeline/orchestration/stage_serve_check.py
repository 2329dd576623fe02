"""The serve-check stage: stage the candidate version, serve it with our own server and ask every artifact (and
every other signature whose inputs the data holds) real requests; the ones that answer wrongly leave the candidate.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np

from tfship.core.contract import Signature
from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact, artifact_kinds, as_text, open_runner
from tfship.pipeline.conversion.convert import ConvertResult, remove_path
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.export_only.user_model import EvalData
from tfship.pipeline.gate.serve_check import ServeCheckResult, ServeTarget, SignatureProbe, serve_check
from tfship.pipeline.gate.serve_check import raise_if_failed as raise_if_serve_check_failed
from tfship.pipeline.gate.validate import ParityReport, tolerance_for
from tfship.pipeline.orchestration.outcomes import artifact_outcomes, left_out_files
from tfship.pipeline.orchestration.publish import write_golden_set
from tfship.pipeline.orchestration.records import CONVERT, SERVE_CHECK, VALIDATE
from tfship.pipeline.orchestration.stage_inputs import eval_inputs, read_contract, reference_artifact
from tfship.pipeline.orchestration.stages import RunFolder
from tfship.serving.dataplane.warmup import write_warmup_requests

GOLDEN_SAMPLES = 64
SERVE_BATCH_SIZES = (1, 7, 32)  # the serve-check's requests (rows each)


def _golden(run: RunFolder, contract: Signature, splits: DatasetSplits | EvalData):
    inputs = {k: v[:GOLDEN_SAMPLES] for k, v in eval_inputs(contract, splits).items()}
    runner = open_runner(reference_artifact(run))
    return inputs, {name: as_text(value) for name, value in runner(inputs).items()}


def _own_answers(artifact: Artifact, inputs: dict[str, np.ndarray], runner=None) -> dict[str, np.ndarray]:
    """The artifact's outputs in process (through `runner`, default its own), request by request as
    serve-check sends them.
    """
    from tfship.pipeline.gate.validate import run_batched

    runner, chunks, offset = runner or open_runner(artifact), [], 0
    for size in SERVE_BATCH_SIZES:
        chunks.append(run_batched(runner, {k: v[offset:offset + size] for k, v in inputs.items()}, size))
        offset += size
    return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}


def signature_probes(run: RunFolder, artifact: Artifact, inputs: dict[str, np.ndarray],
                     parity: ParityReport | None = None) -> tuple[tuple[SignatureProbe, ...], dict[str, str]]:
    """`artifact`'s signatures besides `serving_default` (`pipeline.gate.signatures.carried_signatures`), to ask
    on its server: a probe for each whose inputs the data holds (by name), with the artifact's own in-process
    answers and the SavedModel's own noise on that signature as the validate stage recorded it (`parity`:
    its record; None: read from the run folder); {name: why not} for the rest.
    """
    from tfship.pipeline.gate.signatures import carried_signatures, runner_for, signature_feed

    parity = parity or VALIDATE.load(run)
    noise = parity.signature_noise if parity is not None else {}
    probes, unchecked = [], {}
    signatures = read_signatures(run.artifacts)
    for name in carried_signatures(artifact):
        if name == "serving_default" or name not in signatures:
            continue
        feed, why = signature_feed(signatures[name], inputs)
        if feed is None:
            unchecked[name] = why
            continue
        runner = runner_for(artifact, name)
        try:
            probes.append(SignatureProbe(name, feed, _own_answers(artifact, feed, runner),
                                         {output: value.max_abs for output, value in noise.get(name, {}).items()}))
        finally:
            runner.close()
    return tuple(probes), unchecked


def _serve_targets(config: PipelineConfig, run: RunFolder, parity: ParityReport, inputs) -> list[ServeTarget]:
    """The SavedModel (against its golden outputs, float32 tolerance) and every artifact that passed the parity
    gate (against its own in-process answers: the server must serve exactly what the gate proved).
    """
    kinds = artifact_kinds()
    exact = tolerance_for("float32", config.parity)
    noise = {name: value.max_abs for name, value in parity.noise.items()}
    targets = [ServeTarget(SAVED_MODEL, "saved_model", exact, noise=noise)]
    for row in parity.rows:
        kind = kinds.get(row.artifact)
        if row.passed and kind is not None and kind.backend:
            own = _own_answers(kind.artifact(run.artifacts), inputs)
            targets.append(ServeTarget(kind.name, kind.backend, exact, kind.serve_flags, own, noise=noise))
    return targets


def _with_probes(run: RunFolder, targets: list[ServeTarget], inputs, parity: ParityReport | None = None
                 ) -> tuple[list[ServeTarget], dict]:
    """Each target with its other signatures to ask (`signature_probes`); {artifact: {signature: why not}}."""
    kinds, probed, unchecked = artifact_kinds(), [], {}
    for target in targets:
        kind = kinds.get(target.artifact)
        artifact = (kind.artifact(run.artifacts) if kind is not None
                    else reference_artifact(run))
        probes, skipped = signature_probes(run, artifact, inputs, parity)
        probed.append(replace(target, probes=probes))
        if skipped:
            unchecked[target.artifact] = skipped
    return probed, unchecked


def serve_check_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits | EvalData,
                      converted: ConvertResult | None = None, parity: ParityReport | None = None) -> ServeCheckResult:
    """Stage the version in a private repository (without the artifacts left out so far), write warm-up and
    golden files, serve-check every artifact (and every other signature of the SavedModel whose inputs the
    data holds: `signature_probes`); the ones that fail are removed from the candidate.

    Which files the candidate holds follows the same rule as the final verdict (`artifact_outcomes`, asked
    before and after the check, writing nothing), so the version published and the verdict cannot disagree;
    the verdict itself, with each left-out artifact's reason file, is decided once, by the publish stage.

    converted, parity: the convert and validate stages' records (None: read from the run folder).

    Raises:
        StageError: the validate stage has not run, or the SavedModel or a required artifact failed its check.
    """
    contract = read_contract(run)
    parity = parity or VALIDATE.require(run)
    converted = converted or CONVERT.load(run)
    inputs, expected = _golden(run, contract, splits)
    write_warmup_requests(run.artifacts, config.run.model_name, contract.name, inputs)
    write_golden_set(run.artifacts, inputs, expected)
    candidate = run.candidate_repository / config.run.model_name / "1"
    if candidate.parent.exists():
        shutil.rmtree(candidate.parent)
    SERVE_CHECK.path(run).unlink(missing_ok=True)
    so_far = artifact_outcomes(converted, parity, None, config.convert.required)  # convert and validate
    shutil.copytree(run.artifacts, candidate, ignore=shutil.ignore_patterns(
        ".*", "*.reproduce.sh", "*.representative.npz", *left_out_files(so_far)))
    targets, unchecked = _with_probes(run, _serve_targets(config, run, parity, inputs), inputs, parity)
    if config.export.allow_ops:  # the server judges the version by the op policy too: the same allowance
        allowance = ("--allow-ops", ",".join(config.export.allow_ops))
        targets = [replace(t, serve_flags=(*t.serve_flags, *allowance)) for t in targets]
    result = SERVE_CHECK.save(run, serve_check(run.candidate_repository, config.run.model_name, 1, inputs, expected,
                                               targets, config.convert.required, SERVE_BATCH_SIZES
                                               ).with_unchecked(unchecked))
    for name in left_out_files(artifact_outcomes(converted, parity, result, config.convert.required)):
        for path in candidate.glob(name):  # names or glob patterns (`model.*.onnx`)
            remove_path(path)
    return raise_if_serve_check_failed(result)
