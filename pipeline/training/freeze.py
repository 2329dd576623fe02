"""Freezing layers by name before training (`[train] freeze = ["conv1", "block_*"]`).

A frozen layer gets `trainable = False` (Keras): its weights leave `model.trainable_variables`, so the
tape computes no gradient for them and the optimizer, built on the trainable variables afterwards,
holds no slots for them; their values stay bit-identical. A frozen `BatchNormalization` (directly or
inside a frozen block) runs in inference mode even when called with `training=True` (Keras 3's rule
for non-trainable BatchNormalization): its moving mean and variance are neither used for batch
statistics nor updated.
"""

from __future__ import annotations

import fnmatch

from tfship.core.errors import ConfigError


def _walk(layer):
    for child in getattr(layer, "layers", ()):
        yield child
        yield from _walk(child)


def freeze_layers(model, patterns: tuple[str, ...]) -> list[str]:
    """Set `trainable = False` on every layer (at any depth) whose name matches one of `patterns`.

    Args:
        model: a built Keras model (before the optimizer is built).
        patterns: layer names or fnmatch patterns (`*`, `?`, `[...]`).

    Returns:
        The frozen layers' names, in model order.

    Raises:
        ConfigError: a pattern that matches no layer (naming the layers there are), or one that
            freezes every trainable weight.
    """
    if not patterns:
        return []
    layers = list(_walk(model))
    frozen = []
    for pattern in patterns:
        matched = [layer for layer in layers if fnmatch.fnmatchcase(layer.name, pattern)]
        if not matched:
            raise ConfigError(f"train.freeze: {pattern!r} matches no layer; layers: {[layer.name for layer in layers]}")
        for layer in matched:
            layer.trainable = False
            frozen.append(layer.name)
    if not model.trainable_variables:
        raise ConfigError(f"train.freeze = {list(patterns)} freezes every trainable weight: nothing would train")
    return [layer.name for layer in layers if layer.name in set(frozen)]


def frozen_weights(model, layer_names: list[str]) -> list:
    """The weights of the named (frozen) layers, nested layers included, without duplicates."""
    layers = [layer for layer in [model, *_walk(model)] if layer.name in set(layer_names)]
    seen, weights = set(), []
    for layer in layers:
        for weight in layer.weights:
            if id(weight) not in seen:
                seen.add(id(weight))
                weights.append(weight)
    return weights


def slots_for(optimizer, weights) -> list[str]:
    """Paths of optimizer variables made for any of `weights` (Keras names a slot after its weight's
    path, `/` -> `_`, e.g. `adam/conv0_kernel_momentum`); empty when the optimizer holds none.
    """
    keys = [weight.path.replace("/", "_") for weight in weights]
    return [variable.path for variable in optimizer.variables if any(key in variable.path for key in keys)]
