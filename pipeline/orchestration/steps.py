"""The pipeline's stages as functions of (config, run folder, data, the earlier stages' typed records).

Each stage writes its record into the run folder (`pipeline.orchestration.records`); a record not handed in
(None) is read back from there, so every stage also runs alone from the CLI.

Run folder contents: `model.keras` (train), `artifacts/` (a complete TF Serving version folder:
SavedModel at its root, `model.onnx`, `model*.tflite`, written by export and convert), and one
record per stage (`train.json`, `audit.json` + `export.json`, `convert.json`, `parity.json`, `serve_check.json`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import ContractError, ParityError, StageError
from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.artifacts import (
    SAVED_MODEL,
    Artifact,
    SignatureCarriage,
    artifact_kinds,
    as_text,
    check_required,
    open_runner,
)
from tfship.pipeline.conversion.convert import ConvertResult, convert_artifacts, raise_if_required_missing, remove_path
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.export_only.user_model import EvalData
from tfship.pipeline.gate.serve_check import ServeCheckResult, ServeTarget, SignatureProbe, serve_check
from tfship.pipeline.gate.serve_check import raise_if_failed as raise_if_serve_check_failed
from tfship.pipeline.gate.validate import ParityReport, raise_if_failed, tolerance_for, validate_artifacts
from tfship.pipeline.orchestration.outcomes import artifact_outcomes, left_out_files, run_status, signature_carriers
from tfship.pipeline.orchestration.publish import (
    PublishResult,
    git_commit,
    library_versions,
    publish_version,
    write_golden_set,
)
from tfship.pipeline.orchestration.records import (
    CONVERT,
    EXPORT,
    SERVE_CHECK,
    TRAIN,
    VALIDATE,
    ExportRecord,
    TrainRecord,
)
from tfship.pipeline.orchestration.stages import RunFolder
from tfship.pipeline.training.train import TrainInputs, TrainResult, train_model
from tfship.serving.dataplane.warmup import write_warmup_requests
from tfship.signatures.audit import AuditReport, audit_saved_model
from tfship.signatures.audit import raise_if_failed as raise_if_audit_failed
from tfship.signatures.export import build_classifier_module, classifier_contract, export_saved_model

GOLDEN_SAMPLES = 64
SERVE_BATCH_SIZES = (1, 7, 32)  # the serve-check's requests (rows each)


@dataclass(frozen=True)
class ExportOutcome:
    """The exported SavedModel's contract, its graph audit, its behavioural checks (None when off) and the
    stage's record (`audit.json` + `export.json`) that later stages read.
    """

    contract: Signature
    audit: AuditReport
    behaviour: object | None = None
    record: ExportRecord | None = None


def as_eval_data(config: PipelineConfig, contract: Signature, data: DatasetSplits | EvalData) -> EvalData:
    """The built-in splits as `EvalData` (test split validates, a seeded train subset calibrates)."""
    if isinstance(data, EvalData):
        return data
    (image,) = contract.inputs.values()
    pick = np.random.default_rng(config.run.seed).permutation(len(data.train))[: config.convert.representative_samples]
    return EvalData({image.name: data.test.images}, data.test.labels, {image.name: data.train.images[pick]},
                    tuple(data.class_names), "built-in splits (test)")


def _test_inputs(contract: Signature, splits: DatasetSplits | EvalData) -> dict[str, np.ndarray]:
    if isinstance(splits, EvalData):
        return splits.inputs
    (image,) = contract.inputs.values()
    return {image.name: splits.test.images}


def _audit_and_prove(config: PipelineConfig, run: RunFolder, contract: Signature, inputs,
                     expected_variables, layers, details: dict) -> ExportOutcome:
    """Write `export.json` (`details`), audit and prove the SavedModel, write `audit.json`; raise on a failure."""
    from tfship.pipeline.gate.behaviour import check_behaviour
    from tfship.pipeline.gate.behaviour import raise_if_failed as raise_if_behaviour_failed

    run.write_json("export.json", details)
    audit = audit_saved_model(run.artifacts, expected_variables=expected_variables, layers=layers)
    behaviour = check_behaviour(run.artifacts, inputs, contract.name, config.export.batch_independence_tolerance) \
        if config.export.behaviour_checks else None
    record = EXPORT.save(run, ExportRecord(audit.to_json() | {
        "behaviour": behaviour.to_json() if behaviour else None,
        "passed": audit.passed and (behaviour is None or behaviour.passed)}, details))
    raise_if_audit_failed(audit)
    if behaviour is not None:
        raise_if_behaviour_failed(behaviour)
    return ExportOutcome(contract, audit, behaviour, record)


def export_user_stage(config: PipelineConfig, run: RunFolder, model, data_path: Path,
                      tags: tuple[str, ...] = ("serve",)) -> tuple[ExportOutcome, EvalData]:
    """Export-only mode: export a user's Keras model (or re-export a SavedModel), audit and prove it.

    The contract comes from the model (`signatures.keras_export.contract_from_keras`; a SavedModel keeps
    every signature of its MetaGraph tagged `tags`, `serving_default` being the contract, and only the
    variables those signatures use are re-exported); mixed-precision models are exported as a float32 copy.
    A Keras model's extra signatures come from `[export] extra_signatures`. `data_path` is read for this
    contract (`pipeline.export_only.user_model`). `export.json` records the signatures written and what the
    export removed from the function library (`signatures.forward_only`).

    Raises:
        ContractError, AuditError, DatasetError: the export, the audit, the behaviour checks or the data.
    """
    from tfship.pipeline.export_only.user_model import load_user_data
    from tfship.signatures.export import build_savedmodel_module
    from tfship.signatures.keras_export import build_keras_module, contract_from_keras, extra_contract, float32_copy
    from tfship.signatures.layers import keras_layers

    if isinstance(model, Path):
        contract, others = _user_saved_model_contracts(model, tags)
        data = load_user_data(data_path, contract, config.convert.representative_samples, config.run.seed,
                              config.data.classes)
        module = build_savedmodel_module(model, contract, tags, others)
        result = export_saved_model(module, contract, run.artifacts, others)
        run.write_json("data.json", data.summary() | {"tags": list(tags),
                                                      "variables_left_out": list(module.dropped_variables)})
        return _audit_and_prove(config, run, contract, data.inputs, None, None, _export_record(result)), data
    model = float32_copy(model)
    contract = contract_from_keras(model)
    data = load_user_data(data_path, contract, config.convert.representative_samples, config.run.seed,
                          config.data.classes)
    extras = dict(config.export.extra_signatures)
    result = export_saved_model(build_keras_module(model, contract, extras), contract, run.artifacts,
                                tuple(extra_contract(contract, name, outs) for name, outs in extras.items()))
    run.write_json("data.json", data.summary())
    details = _export_record(result) | {"recurrent": _write_recipe_sources(run, model, contract)}
    return _audit_and_prove(config, run, contract, data.inputs, [w.path for w in model.weights],
                            keras_layers(model), details), data


def _user_saved_model_contracts(folder: Path, tags: tuple[str, ...]) -> tuple[Signature, tuple[Signature, ...]]:
    """(`serving_default`, the MetaGraph's other signatures by name): all are re-exported and served."""
    contracts = read_signatures(folder, tags)
    if "serving_default" not in contracts:
        raise ContractError(f"--model {folder}: the MetaGraph tagged {list(tags)} has no 'serving_default' signature; "
                         f"it has {sorted(contracts)}")
    return contracts["serving_default"], tuple(contracts[name] for name in sorted(contracts)
                                               if name != "serving_default")


def _export_record(result) -> dict:
    """`export.json`'s signatures and forward-only library record for an `ExportResult`."""
    return {"signatures": sorted(result.signatures), **result.cleanup.to_json()}


def train_step_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits, progress=None,
                     resume: bool = False) -> TrainResult:
    """Train (or resume from `checkpoints/`), save `model.keras` and `train.json`; events go to
    `tensorboard/`, event lines to `logs/train.log` (see train_model for the errors raised).
    """
    log_file = run.root / "logs" / "train.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        with log_file.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        if progress is not None:
            progress.console.print(line, highlight=False, markup=False)

    result = train_model(TrainInputs(config, splits, run.checkpoints, run.root / "tensorboard", resume, log), progress)
    result.model.save(run.root / "model.keras")
    TRAIN.save(run, TrainRecord.from_result(result))
    return result


def export_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits, model=None) -> ExportOutcome:
    """Export the trained model's `serving_default` SavedModel into `artifacts/`, then audit it.

    A model trained under `mixed_bfloat16` / `mixed_float16` is exported as its float32 copy
    (`signatures.keras_export.float32_copy`, as export-only mode does): the SavedModel, ONNX and TFLite files
    then compute in float32, so they convert (ONNX has no bfloat16 Conv) and agree with each other at
    float32 tolerances; `export.json` records the precision trained and exported.

    Raises:
        ContractError: the written signature differs from the contract.
        AuditError: the SavedModel holds gradient, optimizer or training-only ops or variables.
    """
    import keras

    if model is None:
        import tfship.pipeline.training.sparse_embedding  # noqa: F401  (registers the text model's layer)

        model_path = run.root / "model.keras"
        if not model_path.is_file():
            raise StageError(f"export: {model_path} does not exist; run the train stage first")
        model = keras.models.load_model(model_path)
    from tfship.signatures.keras_export import float32_copy, low_precision_layers
    from tfship.signatures.layers import keras_layers

    trained_policies = sorted(set(low_precision_layers(model).values()))
    model = float32_copy(model)
    record = {"trained_precision": trained_policies or ["float32"], "exported_precision": "float32",
              "float32_copy": bool(trained_policies)}

    contract = classifier_contract(model.inputs[0].name, tuple(splits.train.images.shape[1:]),
                                   len(splits.class_names), str(model.inputs[0].dtype))
    export_saved_model(build_classifier_module(model, contract), contract, run.artifacts)
    recurrent = _write_recipe_sources(run, model, contract, lambda clone: build_classifier_module(clone, contract))
    return _audit_and_prove(config, run, contract, _test_inputs(contract, splits), [w.path for w in model.weights],
                            keras_layers(model), record | {"recurrent": recurrent})


def read_contract(run: RunFolder) -> Signature:
    """The `serving_default` contract of the run's exported SavedModel."""
    if not (run.artifacts / "saved_model.pb").is_file():
        raise StageError(f"{run.artifacts}/saved_model.pb does not exist; run the export stage first")
    return read_signatures(run.artifacts)["serving_default"]


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


def _write_recipe_sources(run: RunFolder, model, contract: Signature, build_module=None) -> dict:
    """An unrolled copy of a recurrent model for the TFLite converter (`signatures.recurrent`); its record."""
    from tfship.signatures.recurrent import write_unrolled_source

    return write_unrolled_source(model, contract, run.root / "tflite_sources" / "unrolled", build_module)


def produced_artifacts(run: RunFolder, converted: ConvertResult | None = None) -> tuple[Artifact, list[Artifact]]:
    """The SavedModel (reference) and the artifacts the convert stage produced (its record; None: read from
    the run folder).

    Raises:
        StageError: the convert stage has not run in this run folder.
    """
    converted = converted or CONVERT.require(run)
    kinds = artifact_kinds()
    reference = Artifact(SAVED_MODEL, "saved_model", "float32", run.artifacts)
    return reference, [kinds[name].artifact(run.artifacts) for name in converted.produced if name in kinds]


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


def _golden(run: RunFolder, contract: Signature, splits: DatasetSplits | EvalData):
    inputs = {k: v[:GOLDEN_SAMPLES] for k, v in _test_inputs(contract, splits).items()}
    runner = open_runner(Artifact(SAVED_MODEL, "saved_model", "float32", run.artifacts))
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


def signature_probes(run: RunFolder, artifact: Artifact, inputs: dict[str, np.ndarray]
                     ) -> tuple[tuple[SignatureProbe, ...], dict[str, str]]:
    """`artifact`'s signatures besides `serving_default` (`pipeline.gate.signatures.carried_signatures`), to ask
    on its server: a probe for each whose inputs the data holds (by name), with the artifact's own in-process
    answers; {name: why not} for the rest.
    """
    from tfship.pipeline.gate.signatures import carried_signatures, recorded_noise, runner_for, signature_feed

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
                                         recorded_noise(run.root / "parity.json", name)))
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
            targets.append(ServeTarget(kind.name, kind.backend, exact, kind.serve_flags, own, noise))
    return targets


def _with_probes(run: RunFolder, targets: list[ServeTarget], inputs) -> tuple[list[ServeTarget], dict]:
    """Each target with its other signatures to ask (`signature_probes`); {artifact: {signature: why not}}."""
    kinds, probed, unchecked = artifact_kinds(), [], {}
    for target in targets:
        kind = kinds.get(target.artifact)
        artifact = (kind.artifact(run.artifacts) if kind is not None
                    else Artifact(SAVED_MODEL, "saved_model", "float32", run.artifacts))
        probes, skipped = signature_probes(run, artifact, inputs)
        probed.append(replace(target, probes=probes))
        if skipped:
            unchecked[target.artifact] = skipped
    return probed, unchecked


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
    carried = {SAVED_MODEL: signature_carriage(Artifact(SAVED_MODEL, "saved_model", "float32", run.artifacts), names)}
    for outcome in outcomes:
        if outcome.artifact in kinds:
            carried[outcome.artifact] = signature_carriage(kinds[outcome.artifact].artifact(run.artifacts), names,
                                                           conversions.get(outcome.artifact),
                                                           verdicts.get(outcome.artifact))
    return carried


def serve_check_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits | EvalData,
                      converted: ConvertResult | None = None, parity: ParityReport | None = None) -> ServeCheckResult:
    """Stage the version in a private repository (without the artifacts left out so far), write warm-up and
    golden files, serve-check every artifact (and every other signature of the SavedModel whose inputs the
    data holds: `signature_probes`); the ones that fail are removed from the candidate.

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
    so_far = artifact_outcomes(converted, parity, None, config.convert.required, run.root)  # convert and validate
    shutil.copytree(run.artifacts, candidate, ignore=shutil.ignore_patterns(
        ".*", "*.reproduce.sh", "*.representative.npz", *left_out_files(so_far)))
    targets, unchecked = _with_probes(run, _serve_targets(config, run, parity, inputs), inputs)
    result = SERVE_CHECK.save(run, serve_check(run.candidate_repository, config.run.model_name, 1, inputs, expected,
                                               targets, config.convert.required, SERVE_BATCH_SIZES
                                               ).with_unchecked(unchecked))
    for name in left_out_files(artifact_outcomes(converted, parity, result, config.convert.required, run.root)):
        for path in candidate.glob(name):  # names or glob patterns (`model.*.onnx`)
            remove_path(path)
    return raise_if_serve_check_failed(result)


def publish_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits | EvalData, repository: Path,
                  metrics: dict, exported: ExportRecord | None = None, converted: ConvertResult | None = None,
                  parity: ParityReport | None = None, served: ServeCheckResult | None = None) -> PublishResult:
    """Publish the blessed candidate (the SavedModel and every artifact that passed parity and serve-check)
    with its manifest, which lists every artifact's outcome (`artifacts`: published or left out, and why),
    every signature (`signature_def`) and which published artifact carries which (`signatures`).

    The outcomes are decided here, once (`artifact_outcomes`), and returned in `PublishResult.outcomes`; the
    earlier stages' records not handed in (None) are read from the run folder.

    Raises:
        StageError: the export, validate or serve-check record is missing or did not pass (nothing published).
    """
    exported, converted = exported or EXPORT.load(run), converted or CONVERT.load(run)
    parity, served = parity or VALIDATE.load(run), served or SERVE_CHECK.load(run)
    for record_file, record in ((VALIDATE, parity), (SERVE_CHECK, served), (EXPORT, exported)):
        if record is None or not record.passed:
            raise StageError(f"publish: {record_file.path(run)} is missing or did not pass; nothing was published")
    contract = read_contract(run)
    outcomes = artifact_outcomes(converted, parity, served, config.convert.required, run.root)
    signatures = read_signatures(run.artifacts)
    manifest = {
        "status": run_status(outcomes).value,
        "artifacts": [o.to_json() for o in outcomes],
        "run": str(run.root),
        "git_commit": git_commit(Path(__file__).parent),
        "signature_def": {name: signature.to_json() for name, signature in sorted(signatures.items())},
        "signatures": signature_carriers(sorted(signatures), contract.name, outcomes, served,
                                         signatures_carried(run, outcomes, converted, parity)),
        "class_names": list(splits.class_names),
        "data": splits.summary(),
        "metrics": metrics,
        "parity": parity.to_json(),
        "audit": exported.audit,
        "serve_check": served.to_json(),
        "conversions": converted.to_json() if converted is not None else [],
        "libraries": library_versions(),
    }
    candidate = run.candidate_repository / config.run.model_name / "1"
    return replace(publish_version(candidate, repository, config.run.model_name, manifest), outcomes=tuple(outcomes))
