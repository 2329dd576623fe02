"""The export stage: the trained (or a user's) model as a forward-only SavedModel in `<run>/artifacts/`, its graph
audit and behaviour checks (`audit.json`), and what the export wrote (`export.json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tfship.core.contract import Signature
from tfship.core.errors import ContractError, StageError
from tfship.core.op_policy import check_saved_model, raise_if_refused
from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.export_only.user_model import EvalData
from tfship.pipeline.gate.behaviour import BehaviourReport, refused_behaviour
from tfship.pipeline.orchestration.records import EXPORT, ExportRecord
from tfship.pipeline.orchestration.stage_inputs import eval_inputs
from tfship.pipeline.orchestration.stages import RunFolder
from tfship.signatures.audit import AuditReport, audit_saved_model
from tfship.signatures.audit import raise_if_failed as raise_if_audit_failed
from tfship.signatures.export import build_classifier_module, classifier_contract, export_saved_model


@dataclass(frozen=True)
class ExportOutcome:
    """The exported SavedModel's contract, its graph audit, its behavioural checks (None when off) and the
    stage's record (`audit.json` + `export.json`) that later stages read.
    """

    contract: Signature
    audit: AuditReport
    behaviour: BehaviourReport | None
    record: ExportRecord


def _audit_and_prove(config: PipelineConfig, run: RunFolder, contract: Signature, inputs,
                     expected_variables, layers, details: dict) -> ExportOutcome:
    """Write `export.json` (`details`), audit and prove the SavedModel, write `audit.json`; raise on a failure."""
    from tfship.pipeline.gate.behaviour import check_behaviour
    from tfship.pipeline.gate.behaviour import raise_if_failed as raise_if_behaviour_failed

    run.write_json("export.json", details)
    audit = audit_saved_model(run.artifacts, expected_variables=expected_variables, layers=layers,
                              allow_ops=config.export.allow_ops)
    policy = audit.op_policy
    assert policy is not None  # audit_saved_model always runs the op policy
    if not config.export.behaviour_checks:
        behaviour = None
    elif not policy.passed:  # the graph would do what the policy refuses: it is never run, not even here
        behaviour = refused_behaviour(run.artifacts, contract.name, policy)
    else:
        behaviour = check_behaviour(run.artifacts, inputs, contract.name, config.export.batch_independence_tolerance,
                                    side_effects=[f.describe() for f in policy.side_effects(contract.name)])
    record = EXPORT.save(run, ExportRecord(audit.to_json() | {
        "behaviour": behaviour.to_json() if behaviour else None,
        "passed": audit.passed and (behaviour is None or behaviour.passed)}, details))
    raise_if_audit_failed(audit)
    if behaviour is not None:
        raise_if_behaviour_failed(behaviour)
    return ExportOutcome(contract, audit, behaviour, record)


def export_user_stage(config: PipelineConfig, run: RunFolder, model, data_path: Path,
                      tags: tuple[str, ...] = ("serve",), origin: str = "cli") -> tuple[ExportOutcome, EvalData]:
    """Export-only mode: export a user's Keras model (or re-export a SavedModel), audit and prove it.

    The contract comes from the model (`signatures.keras_export.contract_from_keras`; a SavedModel keeps
    every signature of its MetaGraph tagged `tags`, `serving_default` being the contract, and only the
    variables those signatures use are re-exported); mixed-precision models are exported as a float32 copy.
    A Keras model's extra signatures come from `[export] extra_signatures`. `data_path` is read for this
    contract (`pipeline.export_only.user_model`). `export.json` records the signatures written and what the
    export removed from the function library (`signatures.forward_only`). `origin` ("cli" / "python") names the
    user's model and data in refusals as the caller gave them (`--model` or `tfship.ship(model=...)`).

    Raises:
        OpPolicyError: a SavedModel source holds an op the policy refuses (judged before it is loaded).
        ContractError, AuditError, DatasetError: the export, the audit, the behaviour checks or the data.
    """
    from tfship.pipeline.export_only.user_model import load_user_data
    from tfship.signatures.export import build_savedmodel_module
    from tfship.signatures.keras_export import build_keras_module, contract_from_keras, extra_contract, float32_copy
    from tfship.signatures.layers import keras_layers

    if isinstance(model, Path):
        contract, others = _user_saved_model_contracts(model, tags, origin)
        _refuse_before_loading(config, run, model, contract, tags)
        data = load_user_data(data_path, contract, config.convert.representative_samples, config.run.seed,
                              config.data.classes, origin)
        module = build_savedmodel_module(model, contract, tags, others)
        result = export_saved_model(module, contract, run.artifacts, others)
        run.write_json("data.json", data.summary() | {"tags": list(tags),
                                                      "variables_left_out": list(module.dropped_variables)})
        return _audit_and_prove(config, run, contract, data.inputs, None, None, _export_record(result)), data
    model = float32_copy(model)
    contract = contract_from_keras(model)
    data = load_user_data(data_path, contract, config.convert.representative_samples, config.run.seed,
                          config.data.classes, origin)
    extras = dict(config.export.extra_signatures)
    result = export_saved_model(build_keras_module(model, contract, extras), contract, run.artifacts,
                                tuple(extra_contract(contract, name, outs) for name, outs in extras.items()))
    run.write_json("data.json", data.summary())
    details = _export_record(result) | {"recurrent": _write_recipe_sources(run, model, contract)}
    return _audit_and_prove(config, run, contract, data.inputs, [w.path for w in model.weights],
                            keras_layers(model), details), data


def _refuse_before_loading(config: PipelineConfig, run: RunFolder, folder: Path, contract: Signature,
                           tags: tuple[str, ...]) -> None:
    """The user's SavedModel (its MetaGraph tagged `tags`, the one loaded) judged by the op policy before anything
    loads it: loading runs its restore and init functions (`tf.saved_model.load`), re-exporting traces its
    signatures. A refusal writes `audit.json` (`passed: false`, the violations) and raises.

    Raises:
        OpPolicyError: an op the policy refuses (`core.op_policy`), not allowed by `export.allow_ops`.
    """
    policy = check_saved_model(folder, config.export.allow_ops, tags)
    if policy.passed:
        return
    EXPORT.save(run, ExportRecord({
        "passed": False, "source": str(folder), "signatures": sorted(read_signatures(folder, tags)), "op_histogram": {},
        "variables": [], "violations": policy.violations, "op_policy": policy.to_json(),
        "behaviour": refused_behaviour(folder, contract.name, policy).to_json()}, {"refused_source": str(folder)}))
    raise_if_refused(policy, "export.allow_ops")


def _user_saved_model_contracts(folder: Path, tags: tuple[str, ...],
                                origin: str = "cli") -> tuple[Signature, tuple[Signature, ...]]:
    """(`serving_default`, the MetaGraph's other signatures by name): all are re-exported and served."""
    contracts = read_signatures(folder, tags)
    if "serving_default" not in contracts:
        from tfship.pipeline.export_only.user_model import argument

        raise ContractError(f"{argument(origin, 'model', folder)}: the MetaGraph tagged {list(tags)} has no "
                            f"'serving_default' signature; it has {sorted(contracts)}")
    return contracts["serving_default"], tuple(contracts[name] for name in sorted(contracts)
                                               if name != "serving_default")


def _export_record(result) -> dict:
    """`export.json`'s signatures and forward-only library record for an `ExportResult`."""
    return {"signatures": sorted(result.signatures), **result.cleanup.to_json()}


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

    images = splits.train.images
    assert not isinstance(images, dict)  # named inputs are exported by export_user_stage (chain._export)
    contract = classifier_contract(model.inputs[0].name, tuple(images.shape[1:]),
                                   len(splits.class_names), str(model.inputs[0].dtype))
    export_saved_model(build_classifier_module(model, contract), contract, run.artifacts)
    recurrent = _write_recipe_sources(run, model, contract, lambda clone: build_classifier_module(clone, contract))
    return _audit_and_prove(config, run, contract, eval_inputs(contract, splits), [w.path for w in model.weights],
                            keras_layers(model), record | {"recurrent": recurrent})


def _write_recipe_sources(run: RunFolder, model, contract: Signature, build_module=None) -> dict:
    """An unrolled copy of a recurrent model for the TFLite converter (`signatures.recurrent`); its record."""
    from tfship.signatures.recurrent import write_unrolled_source

    return write_unrolled_source(model, contract, run.root / "tflite_sources" / "unrolled", build_module)
