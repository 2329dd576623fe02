"""float16 range check of activations: run representative inputs through the float32 graph in LiteRT and
name every intermediate tensor whose magnitude exceeds float16's largest finite value (65,504).

float16 weights alone can fit while an activation overflows (it becomes inf in a float16 kernel), so the
float16 conversion checks both (`tflite.worker`). Imports only numpy and LiteRT.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOAT16_MAX = 65504.0
CHUNK_ROWS = 32


@dataclass(frozen=True)
class ActivationOverflow:
    """An intermediate (or output) tensor of the float32 graph beyond float16's range on real inputs."""

    name: str
    max_abs: float

    def describe(self) -> str:
        """e.g. `activation 'model/dense/BiasAdd' max |x| = 90000`."""
        return f"activation {self.name!r} max |x| = {self.max_abs:.6g}"


def find_activation_overflows(float32_model: bytes, samples: dict[str, np.ndarray], signature: str = "serving_default",
                              limit: float = FLOAT16_MAX) -> list[ActivationOverflow]:
    """Every float tensor of `float32_model` whose largest magnitude over `samples` exceeds `limit`.

    Args:
        float32_model: a float32 `.tflite` flatbuffer of the same graph.
        samples: {signature input name: [N, ...]} representative inputs (run in chunks of 32 rows).

    Returns:
        The overflowing tensors, largest first (empty when every activation fits float16).
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=float32_model, experimental_preserve_all_tensors=True)
    runner = interpreter.get_signature_runner(signature)
    peaks: dict[str, float] = {}
    total = len(next(iter(samples.values())))
    for start in range(0, total, CHUNK_ROWS):
        runner(**{name: np.asarray(value[start:start + CHUNK_ROWS]) for name, value in samples.items()})
        for detail in interpreter.get_tensor_details():
            if np.dtype(detail["dtype"]).kind != "f":
                continue
            try:
                value = interpreter.get_tensor(detail["index"])
            except ValueError:  # a tensor without data (e.g. not allocated in this subgraph)
                continue
            if value.size:
                peak = float(np.max(np.abs(value.astype(np.float64))))
                peaks[detail["name"]] = max(peaks.get(detail["name"], 0.0), peak)
    found = [ActivationOverflow(name, peak) for name, peak in peaks.items() if peak > limit]
    return sorted(found, key=lambda o: -o.max_abs)
