"""Wide MLPs of a chosen weight size for `make bench-pipeline`, built here (no downloads).

`build(size_mb, folder)` writes `<folder>/model.keras` (784 -> 4 x width ReLU -> 10 softmax, width
chosen so the float32 weights are about `size_mb` MB) and `<folder>/data.npz` (`x` float32 [256, 784],
`y` the model's own argmax, so every float artifact scores 100 % and a quantized one's drop is its
own). The rows are the 256 of 2,048 random ones with the widest gap between the two top classes, and
the last layer is scaled by 8, so quantization noise does not flip near-ties of a random network. A name instead
of a size (`resnet50`) builds that zoo architecture (`bench.zoo.members`). Run in a child process (it imports
TensorFlow).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

INPUTS, DEPTH, CLASSES, ROWS = 784, 4, 10, 256


def width_for(size_mb: float) -> int:
    """Hidden width whose float32 weights are closest to `size_mb` MB (1 MB = 10^6 bytes)."""
    params = size_mb * 1e6 / 4
    # (DEPTH - 1) w^2 + (INPUTS + CLASSES + DEPTH) w - params = 0
    a, b = DEPTH - 1, INPUTS + CLASSES + DEPTH
    return max(8, int((-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)))


def build(size_mb: float, folder: Path) -> dict:
    """Write the model and data for `size_mb`; returns {width, params, weight_bytes}."""
    import keras

    keras.utils.set_random_seed(0)
    width = width_for(size_mb)
    inputs = hidden = keras.Input((INPUTS,), name="x")
    for _ in range(DEPTH):
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
    last = keras.layers.Dense(CLASSES, activation="softmax")
    model = keras.Model(inputs, last(hidden))  # functional: see the report about loaded Sequential models
    last.kernel.assign(last.kernel.numpy() * 8.0)
    pool = np.random.default_rng(0).random((8 * ROWS, INPUTS), dtype=np.float32)
    probabilities = model.predict(pool, verbose=0, batch_size=256)
    top2 = np.sort(probabilities, axis=1)[:, -2:]
    keep = np.sort(np.argsort(top2[:, 1] - top2[:, 0])[-ROWS:])  # the rows with the clearest winner
    x, y = pool[keep], np.argmax(probabilities[keep], axis=1).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    model.save(folder / "model.keras")
    np.savez(folder / "data.npz", x=x, y=y)
    params = int(sum(np.prod(w.shape) for w in model.weights))
    return {"width": width, "params": params, "weight_bytes": params * 4}


def build_named(name: str, folder: Path) -> dict:
    """A zoo architecture instead of an MLP (`bench.zoo.members`, e.g. `resnet50`): its `.keras` file and data."""
    from bench.zoo.members import build_member

    info = build_member(name, folder, routes=("keras",))
    return {"width": name, "params": info["params"], "weight_bytes": info["params"] * 4, "label": name}


if __name__ == "__main__":
    size = sys.argv[1]
    built = build_named(size, Path(sys.argv[2])) if size.isalpha() or not size.replace(".", "").isdigit() \
        else build(float(size), Path(sys.argv[2]))
    print("RESULT " + json.dumps(built))
