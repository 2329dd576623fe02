"""What several stages read from the run folder and the data: the contract, the reference and produced
artifacts, and the held-out data as `EvalData`.

Shapes: `EvalData.inputs` maps each input name to an array whose first axis is examples.
"""

from __future__ import annotations

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import StageError
from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact, artifact_kinds
from tfship.pipeline.conversion.convert import ConvertResult
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.export_only.user_model import EvalData
from tfship.pipeline.orchestration.records import CONVERT
from tfship.pipeline.orchestration.stages import RunFolder


def as_eval_data(config: PipelineConfig, contract: Signature, data: DatasetSplits | EvalData) -> EvalData:
    """The built-in splits as `EvalData` (test split validates, a seeded train subset calibrates)."""
    if isinstance(data, EvalData):
        return data
    (image,) = contract.inputs.values()
    test, train = data.test.images, data.train.images
    assert not isinstance(test, dict) and not isinstance(train, dict)  # one input (named inputs: EvalData already)
    pick = np.random.default_rng(config.run.seed).permutation(len(data.train))[: config.convert.representative_samples]
    return EvalData({image.name: test}, data.test.labels, {image.name: train[pick]},
                    tuple(data.class_names), "built-in splits (test)")


def eval_inputs(contract: Signature, splits: DatasetSplits | EvalData) -> dict[str, np.ndarray]:
    """The held-out inputs by name (the built-in splits' test images under the contract's one input)."""
    if isinstance(splits, EvalData):
        return splits.inputs
    (image,) = contract.inputs.values()
    images = splits.test.images
    assert not isinstance(images, dict)  # one input (named inputs: EvalData already)
    return {image.name: images}


def read_contract(run: RunFolder) -> Signature:
    """The `serving_default` contract of the run's exported SavedModel."""
    if not (run.artifacts / "saved_model.pb").is_file():
        raise StageError(f"{run.artifacts}/saved_model.pb does not exist; run the export stage first")
    return read_signatures(run.artifacts)["serving_default"]


def reference_artifact(run: RunFolder) -> Artifact:
    """The run's exported SavedModel as the gate's reference artifact (`saved_model`, float32 family)."""
    return Artifact(SAVED_MODEL, "saved_model", "float32", run.artifacts)


def produced_artifacts(run: RunFolder, converted: ConvertResult | None = None) -> tuple[Artifact, list[Artifact]]:
    """The SavedModel (reference) and the artifacts the convert stage produced (its record; None: read from
    the run folder).

    Raises:
        StageError: the convert stage has not run in this run folder.
    """
    converted = converted or CONVERT.require(run)
    kinds = artifact_kinds()
    reference = reference_artifact(run)
    return reference, [kinds[name].artifact(run.artifacts) for name in converted.produced if name in kinds]
