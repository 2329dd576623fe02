"""How much a correct float32 computation of the reference may differ from it: the two noises every float32
bound is built from (docs/pipeline.md, "Parity tolerances").

* **Reference (batch) noise** (`reference_noise`): the largest difference the SavedModel shows against
  *itself* on one float output, between the configured batch sizes and across two identical calls (same
  kernels, different batch splits: XLA/oneDNN pick other blockings per batch size).
* **Implementation noise** (`implementation_noise`): the SavedModel's own float32 rounding error on one
  output, max |SavedModel in float32 - the same graph in float64| over the held-out rows
  (`pipeline.gate.float64.float64_outputs`, every float32 tensor, weight and input of the frozen graph
  widened to float64). A second correct float32 implementation of the same graph (another kernel library,
  another summation order: XNNPACK in LiteRT, MLAS in ONNX Runtime) has a rounding error of the same order
  against that truth, so its difference from the SavedModel is at most the sum of the two errors; the
  float32 bound allows `validate.implementation_noise_multiplier` (m) times the SavedModel's error, i.e. an
  artifact whose own rounding error is up to m - 1 times the SavedModel's.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FLOAT64_METHOD", "ImplementationNoise", "ReferenceNoise", "implementation_noise", "noise_hint",
           "reference_noise", "truth_errors"]

FLOAT64_METHOD = "the SavedModel's float32 rounding error: max |SavedModel - same graph in float64|"


@dataclass(frozen=True)
class ReferenceNoise:
    """The largest difference the SavedModel shows against itself on one float output.

    max_abs: largest |SavedModel at batch a - SavedModel at batch b| over the configured batch sizes and a
    repeated call at the largest one (the output's unit); batch_sizes: the pair (a, b) where it was largest
    (equal sizes: two identical calls).
    """

    max_abs: float
    batch_sizes: tuple[int, int]

    def describe(self) -> str:
        """e.g. `the SavedModel itself differs by up to 1.5e-05 between batch 1 and batch 40`."""
        a, b = self.batch_sizes
        where = f"between batch {a} and batch {b}" if a != b else f"between two identical calls at batch {a}"
        return f"the SavedModel itself differs by up to {self.max_abs:.2g} {where}"


@dataclass(frozen=True)
class ImplementationNoise:
    """The SavedModel's own float32 rounding error on one float output (the scale of what a second correct
    float32 implementation may differ by).

    max_abs: max |SavedModel (float32) - the same graph in float64| over the held-out rows (the output's unit);
    method: how it was measured (`FLOAT64_METHOD`), or why it was not ("" max_abs 0: not measured, the
    float32 bound is then `validate.float32.atol`/`.rtol` and the batch noise alone).
    """

    max_abs: float
    method: str

    def describe(self) -> str:
        """e.g. `the SavedModel's own float32 rounding error (against float64) is up to 2.1e-06`."""
        if not self.max_abs:
            return f"implementation noise not measured ({self.method})"
        return f"the SavedModel's own float32 rounding error (against float64) is up to {self.max_abs:.2g}"


def reference_noise(by_batch: dict[int, dict[str, np.ndarray]],
                    repeat: dict[str, np.ndarray] | None = None) -> dict[str, ReferenceNoise]:
    """{float output: `ReferenceNoise`} from the SavedModel's outputs at each batch size (same rows) and a
    repeated call at the largest batch size; the largest batch size's outputs are the reference.
    """
    largest = max(by_batch)
    base = by_batch[largest]
    runs = [(size, outputs) for size, outputs in sorted(by_batch.items()) if size != largest]
    runs += [(largest, repeat)] if repeat is not None else []
    noise = {}
    for name, value in base.items():
        value = np.asarray(value)
        if value.dtype.kind != "f":
            continue
        worst = ReferenceNoise(0.0, (largest, largest))
        for size, outputs in runs:
            other = np.asarray(outputs[name], dtype=np.float64)
            if other.shape != value.shape or not np.all(np.isfinite(other)) or not np.all(np.isfinite(value)):
                continue
            gap = float(np.max(np.abs(other - value.astype(np.float64)))) if value.size else 0.0
            if gap > worst.max_abs:
                worst = ReferenceNoise(gap, (size, largest))
        noise[name] = worst
    return noise


def truth_errors(outputs: dict[str, np.ndarray], truth: dict[str, np.ndarray]) -> dict[str, float]:
    """{float output: max |outputs - truth|} for every output present in both with the same shape and finite
    values (`truth`: the float64 evaluation, `pipeline.gate.float64.float64_outputs`).
    """
    errors = {}
    for name, exact in truth.items():
        got = outputs.get(name)
        if got is None or np.asarray(got).dtype.kind != "f" or np.shape(got) != np.shape(exact):
            continue
        got64, exact64 = np.asarray(got, dtype=np.float64), np.asarray(exact, dtype=np.float64)
        if got64.size and np.all(np.isfinite(got64)) and np.all(np.isfinite(exact64)):
            errors[name] = float(np.max(np.abs(got64 - exact64)))
    return errors


def implementation_noise(reference: dict[str, np.ndarray], truth: dict[str, np.ndarray] | None,
                         why_not: str = "") -> dict[str, ImplementationNoise]:
    """{float output of `reference`: `ImplementationNoise`}: the reference's float32 error against `truth`
    (its float64 evaluation on the same rows), or not measured (max_abs 0, `why_not`) when `truth` is None
    or lacks the output.
    """
    errors = truth_errors(reference, truth) if truth is not None else {}
    noise = {}
    for name, value in reference.items():
        if np.asarray(value).dtype.kind != "f":
            continue
        noise[name] = (ImplementationNoise(errors[name], FLOAT64_METHOD) if name in errors
                       else ImplementationNoise(0.0, why_not or "no float64 evaluation of this output"))
    return noise


def noise_hint(noise: ReferenceNoise | None, tolerance, implementation: ImplementationNoise | None = None) -> str:
    """What to change when a float output misses its bound: the reference's own noises and the settings
    (`tolerance`: the `pipeline.gate.compare.Tolerance` it missed).
    """
    current = tolerance.atol
    measured = noise is not None and noise.max_abs > 0
    text = (f"{noise.describe()}, allowed {tolerance.noise_multiplier:g}x on top of the bound"
            if measured and noise is not None
            else "the SavedModel shows no difference against itself on it")
    if implementation is not None and tolerance.implementation_multiplier:
        text += f"; {implementation.describe()}"
        text += (f", allowed {tolerance.implementation_multiplier:g}x (validate.implementation_noise_multiplier)"
                 if implementation.max_abs else "")
    setting = tolerance.setting or "validate.float32.atol"
    return (f"{text}; to accept a larger difference raise {setting} (now {current:g})"
            + (" or validate.noise_multiplier" if measured else ""))
