"""What float16 cannot hold, found statically and reported as warnings: the parity gate's measured comparison
decides whether a float16 file is wrong (docs/pipeline.md, Parity tolerances).

* stored tensors (weights, graph constants) above 65504 (`tflite.savedmodel_scan.find_float16_overflows`): the
  TFLite converter clamps them to +-65504, so Keras' masked-softmax fill value (-1e9) still masks, and a weight
  that matters shows in the outputs as an error beyond the float16 bound (or NaN/Inf), naming the output;
* activations above 65504 on the representative rows, run through the float32 graph in LiteRT
  (`tflite.activation_scan`): LiteRT on CPU computes a float16 file in float32 (weights dequantized), so they
  do not overflow where the gate and tfship's servers run it; a float16 GPU delegate would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

SIGNATURE_KEY = "serving_default"

__all__ = ["float16_warnings"]


def _activations(samples: dict[str, np.ndarray] | None, float32_model: Callable[[], bytes]) -> str:
    """Which activations of the representative rows float16 cannot hold, or "" (none given: not checked)."""
    from tfship.tflite.activation_scan import find_activation_overflows

    if not samples:
        return ""
    try:
        model = float32_model()
    except Exception:  # noqa: BLE001 - the float16 conversion itself then fails and reports the converter's reason
        return ""
    overflows = find_activation_overflows(model, samples, SIGNATURE_KEY)
    if not overflows:
        return ""
    listed = "; ".join(o.describe() for o in overflows[:5])
    rows = len(next(iter(samples.values())))
    return (f"float16 cannot hold {len(overflows)} activation(s) above 65504 on {rows} representative rows "
            f"(run through the float32 graph): {listed}")


def float16_warnings(saved_model_dir: str, samples: dict[str, np.ndarray] | None,
                     float32_model: Callable[[], bytes]) -> list[str]:
    """The warnings of a float16 conversion of `saved_model_dir` (module docstring), each naming the tensors.

    Args:
        saved_model_dir: the SavedModel folder.
        samples: representative rows {input: [N, ...]} (None: activations not checked).
        float32_model: builds the float32 TFLite file (bytes) the activations are measured in.
    """
    from tfship.tflite.savedmodel_scan import find_float16_overflows

    warnings = []
    overflows = find_float16_overflows(Path(saved_model_dir))
    if overflows:
        listed = "; ".join(o.describe() for o in overflows[:5])
        warnings.append(f"float16 cannot hold {len(overflows)} tensor(s) above 65504: {listed} (the converter "
                        "clamps them to +-65504; the parity gate's measured comparison decides)")
    problem = _activations(samples, float32_model)
    if problem:
        warnings.append(problem + " (LiteRT on CPU computes float16 files in float32; a float16 GPU delegate "
                        "would overflow there)")
    return warnings
