"""Map graph op names back to the Keras layers that created them, and classify training-sensitive layers.

Keras 3 on TensorFlow opens one name scope per model and per layer call, so an op inside a serving
function is named like `functional_1/bn_1/AssignVariableOp` (a `_<n>` suffix is added when a scope name is
reused). `layer_for_op` walks those scope components from the innermost out and returns the first one
that names a layer of the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SUFFIX = re.compile(r"_\d+$")

BATCH_NORM = "batch_normalization"
DROPOUT_NOISE = "dropout_or_noise"
AUGMENTATION = "augmentation"
_KIND_BY_CLASS = {
    "BatchNormalization": BATCH_NORM, "SyncBatchNormalization": BATCH_NORM,
    "Dropout": DROPOUT_NOISE, "SpatialDropout1D": DROPOUT_NOISE, "SpatialDropout2D": DROPOUT_NOISE,
    "SpatialDropout3D": DROPOUT_NOISE, "AlphaDropout": DROPOUT_NOISE, "GaussianDropout": DROPOUT_NOISE,
    "GaussianNoise": DROPOUT_NOISE,
}
_AUGMENTATION_PREFIX = ("Random",)  # RandomFlip, RandomRotation, RandomZoom, RandomContrast, ...
_AUGMENTATION_CLASSES = {"MixUp", "CutMix", "AugMix", "RandAugment", "Solarization", "RandomErasing"}


@dataclass(frozen=True)
class LayerInfo:
    """One Keras layer: its name, class name and the Keras base class that makes it training-sensitive.

    kind: `batch_normalization`, `dropout_or_noise`, `augmentation` or "" (behaves the same in training).
    lineage: class names from the layer's class up to `Layer` (e.g. `("ForcedBN", "BatchNormalization")`).
    """

    name: str
    class_name: str
    kind: str
    lineage: tuple[str, ...]

    def describe(self) -> str:
        """`'bn' (ForcedBN, a BatchNormalization)` style text for messages."""
        base = next((c for c in self.lineage if c in _KIND_BY_CLASS or _is_augmentation(c)), "")
        suffix = f", a {base}" if base and base != self.class_name else ""
        return f"'{self.name}' ({self.class_name}{suffix})"


def _is_augmentation(class_name: str) -> bool:
    return class_name.startswith(_AUGMENTATION_PREFIX) or class_name in _AUGMENTATION_CLASSES


def _kind(lineage: tuple[str, ...]) -> str:
    for class_name in lineage:
        if class_name in _KIND_BY_CLASS:
            return _KIND_BY_CLASS[class_name]
        if _is_augmentation(class_name):
            return AUGMENTATION
    return ""


def keras_layers(model) -> dict[str, LayerInfo]:
    """{layer name: LayerInfo} for every layer of `model`, nested models and layers included."""
    found = {}
    for layer in model._flatten_layers(include_self=True):
        lineage = tuple(c.__name__ for c in type(layer).__mro__ if c.__name__ not in ("object",))
        lineage = lineage[: lineage.index("Layer")] if "Layer" in lineage else lineage
        found[layer.name] = LayerInfo(layer.name, type(layer).__name__, _kind(lineage), lineage)
    return found


def layer_for_op(op_name: str, layers: dict[str, LayerInfo]) -> LayerInfo | None:
    """The innermost layer whose scope holds `op_name` (exact scope name first, then without `_<n>`)."""
    parts = op_name.split("/")[:-1]
    for part in reversed(parts):
        if part in layers:
            return layers[part]
        stripped = _SUFFIX.sub("", part)
        if stripped in layers:
            return layers[stripped]
    return None


def explain(op_kind: str, layer: LayerInfo) -> str:
    """Why an op of `op_kind` (`random`, `variable write`, `batch statistics`) inside `layer` is a leak."""
    if layer.kind == BATCH_NORM:
        return (f"Keras layer {layer.describe()} runs in training mode at serving time (batch statistics and "
                "moving-average updates); call it with training=False")
    if layer.kind == DROPOUT_NOISE:
        return f"Keras layer {layer.describe()} is active at serving time (dropout/noise in training mode)"
    if layer.kind == AUGMENTATION:
        return f"Keras augmentation layer {layer.describe()} is active at serving time (training-mode {op_kind})"
    return f"in Keras layer {layer.describe()}"
