"""The one output comparison: every gate (validate, the behaviour checks, serve-check) judges an
artifact's outputs against the reference's with `compare_outputs`, per output, matched by name.

Rules (per output):

* float outputs: every element must satisfy |got - want| <= atol * scale + rtol * |want|, where
  scale = max(1, max |want|) over that output (the tolerance follows the output's range, so an output
  around 12.6 allows 12.6x the absolute error of an output around 1); NaN or Inf fails; an output
  pinned at a limit the reference goes beyond (an int8 output saturating at its quantization range,
  e.g. every log-probability below -16 coming back as exactly -15.9375) fails as `saturated`, naming
  the limit, even when the values are within a loosened bound (`SATURATION_MARGIN`);
* integer outputs: exactly equal, except index outputs (an integer [N] output that is the argmax of a
  float [N, C] output of the reference, `task_metric.index_scores`), where a differing index passes when
  the reference's scores at both indices differ by no more than the two scores' bounds together (a tie);
* string outputs: exactly equal (bytes and str compare as UTF-8 text, as TF Serving's `string_val`).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tfship.pipeline.conversion.artifacts import as_text

__all__ = ["ERROR_BIN_EDGES", "OutputParity", "Tolerance", "as_text", "compare_output", "compare_outputs", "failures",
           "saturation"]

# Absolute-error histogram bins: [0, 1e-9), [1e-9, 1e-8), ..., [1e1, inf).
ERROR_BIN_EDGES = (0.0, *(10.0 ** e for e in range(-9, 2)), float("inf"))
# How far (fraction of the output's range) beyond an artifact's extreme value a reference value must lie to
# count as clipped there; independent of the tolerance, so loosening a bound never hides a saturation.
SATURATION_MARGIN = 1e-3
# A clip costing at most this many steps of the output's value grid is ordinary rounding at the edge of the
# quantization range (a softmax probability of 0.9996 read back as 255/256), not a saturation.
SATURATION_STEPS = 1.5
# ... and a clip must cost more than this share of the output's range (max(1, max |reference|)).
SATURATION_RANGE = 0.1
# ... and hold at least this share of the output's values (a systematic pin, not a calibration tail).
SATURATION_SHARE = 1e-3


@dataclass(frozen=True)
class Tolerance:
    """A per-output bound: |got - want| <= atol * max(1, max |want|) + rtol * |want| (elementwise).

    atol: fraction of the output's range (dimensionless); rtol: fraction of each reference value;
    outliers: the share of an output's elements allowed beyond the bound (0 for float modes; quantized modes
    allow a few values just outside the calibrated range, e.g. 0.001 = 0.1 %).
    """

    atol: float
    rtol: float
    outliers: float = 0.0

    def scale(self, want: np.ndarray) -> float:
        """max(1, max |want|): the output's range the absolute part is scaled by."""
        finite = np.abs(want[np.isfinite(want)]) if want.size else want
        return max(1.0, float(np.max(finite))) if finite.size else 1.0

    def bound(self, want: np.ndarray) -> np.ndarray:
        """The allowed absolute error per element (same shape as `want`)."""
        return self.atol * self.scale(want) + self.rtol * np.abs(want)

    def describe(self, want: np.ndarray) -> str:
        """e.g. `atol 1e-05*12.6 + rtol 1e-05`."""
        text = f"atol {self.atol:g}*{self.scale(want):.3g} + rtol {self.rtol:g}"
        return text + (f" (up to {100 * self.outliers:g} % of elements beyond)" if self.outliers else "")


@dataclass(frozen=True)
class OutputParity:
    """One output of one artifact against the reference: max abs/rel error and the verdict.

    max_abs_error: largest |got - want| (float outputs), the largest index distance (integer outputs) or
    the count of differing strings; exact: an integer or string output (compared for equality).
    """

    output: str
    max_abs_error: float
    max_rel_error: float
    tolerance: str
    passed: bool
    detail: str = ""
    error_histogram: tuple[int, ...] = ()
    exact: bool = False

    def describe(self) -> str:
        """A failure reason naming the output, its error and the bound."""
        if self.exact or "outside tolerance" in self.detail or not self.detail:
            text = f"output '{self.output}' max error {self.max_abs_error:.3g} outside {self.tolerance}"
            return text + (f" ({self.detail})" if self.detail else "")
        return f"output '{self.output}' {self.detail} (max error {self.max_abs_error:.3g}, bound {self.tolerance})"


def error_histogram(error: np.ndarray) -> tuple[int, ...]:
    """Counts of absolute errors in the `ERROR_BIN_EDGES` bins."""
    counts, _ = np.histogram(np.asarray(error, dtype=np.float64).ravel(), bins=np.array(ERROR_BIN_EDGES))
    return tuple(int(c) for c in counts)


def saturation(got: np.ndarray, want: np.ndarray, bound: float, scale: float = 1.0) -> str:
    """Why `got` is pinned at a limit the reference goes beyond, or "" when it is not.

    An output is saturated at its minimum (maximum) when at least two different reference values lie more
    than `bound` below (above) the artifact's minimum (maximum) and every one of them came back as exactly
    that minimum (maximum), and the farthest of them lies beyond it by more than `SATURATION_STEPS` steps
    of the output's value grid and more than `SATURATION_RANGE` of `scale` (the output's range): a
    quantized output clipped at its quantization range. One value alone is just the artifact's own
    extreme (e.g. after a constant shift); a clip within a step or so is the grid's own rounding (a softmax
    probability of 0.9996 read back as 255/256); a few held-out values a little outside the calibrated
    range (fewer than `SATURATION_SHARE` of the values) are left to the value bound.
    """
    if got.size == 0:
        return ""
    gaps = np.diff(np.unique(got))
    step = float(gaps.min()) if gaps.size else 0.0  # the output's grid: one quantization step when quantized
    for side, limit in (("below", float(np.min(got))), ("above", float(np.max(got)))):
        beyond = want < limit - bound if side == "below" else want > limit + bound
        if beyond.sum() < max(2, SATURATION_SHARE * got.size) or np.unique(want[beyond]).size < 2 \
                or not np.all(got[beyond] == limit):
            continue
        extreme = float(np.min(want[beyond]) if side == "below" else np.max(want[beyond]))
        if abs(extreme - limit) > max(SATURATION_STEPS * step, SATURATION_RANGE * scale):
            reach = "down to" if side == "below" else "up to"
            return (f"saturated: all {int(beyond.sum())} of {got.size} values whose reference lies {side} "
                    f"{limit:.6g} ({reach} {extreme:.6g}) come back as exactly {limit:.6g}")
    return ""


def _compare_strings(name: str, got: np.ndarray, want: np.ndarray) -> OutputParity:
    differ = as_text(got) != as_text(want)
    return OutputParity(name, float(differ.sum()), 0.0, "exact (strings)", not differ.any(),
                        f"{int(differ.sum())} of {differ.size} strings differ" if differ.any() else "", exact=True)


def _compare_floats(name: str, got: np.ndarray, want: np.ndarray, tolerance: Tolerance) -> OutputParity:
    if not np.all(np.isfinite(got)):
        bad = int(np.sum(~np.isfinite(got)))
        return OutputParity(name, float("nan"), float("nan"), "finite", False, f"NaN or Inf in output ({bad} values)")
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    error = np.abs(got64 - want64)
    max_abs = float(error.max()) if error.size else 0.0
    rel = float(np.max(error / np.maximum(np.abs(want64), 1e-12))) if error.size else 0.0
    bound = tolerance.bound(want64)
    outside = error > bound
    pinned = saturation(got64, want64, SATURATION_MARGIN * tolerance.scale(want64), tolerance.scale(want64))
    allowed = int(tolerance.outliers * outside.size)
    details = [f"{int(outside.sum())} of {outside.size} elements outside tolerance"
               + (f" (at most {allowed} allowed)" if allowed else "")] if outside.sum() > allowed else []
    details += [pinned] if pinned else []
    return OutputParity(name, max_abs, rel, tolerance.describe(want64), not details, "; ".join(details),
                        error_histogram(error))


def _compare_integers(name: str, got: np.ndarray, want: np.ndarray, tolerance: Tolerance,
                      scores: np.ndarray | None) -> OutputParity:
    differ = got != want
    distance = np.abs(got.astype(np.int64) - want.astype(np.int64))
    max_abs = float(np.max(distance)) if got.size else 0.0
    unexplained = int(differ.sum())
    if differ.any() and scores is not None and want.ndim == 1:
        rows = np.nonzero(differ)[0]
        at_got, at_want = scores[rows, got[rows]], scores[rows, want[rows]]
        allowed = 2.0 * tolerance.atol * tolerance.scale(scores) + tolerance.rtol * (np.abs(at_got) + np.abs(at_want))
        ties = np.abs(at_got - at_want) <= allowed  # both scores may move by their own bound
        unexplained = int((~ties).sum())
    detail = f"{unexplained} of {differ.size} indices differ (ties excluded)" if unexplained else ""
    return OutputParity(name, max_abs, 0.0, "exact (tie-aware)" if scores is not None else "exact",
                        unexplained == 0, detail, error_histogram(distance), exact=True)


def compare_output(name: str, got: np.ndarray, want: np.ndarray, tolerance: Tolerance,
                   scores: np.ndarray | None = None) -> OutputParity:
    """Compare one named output with the reference's (rules in the module docstring).

    Args:
        got, want: the artifact's and the reference's arrays, same shape [N, ...].
        tolerance: the bound for float outputs (and for ties of index outputs).
        scores: for an index output, the reference's float [N, C] scores it is the argmax of; else None.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return OutputParity(name, float("inf"), float("inf"), "shape", False,
                            f"shape {list(got.shape)}, expected {list(want.shape)}")
    if want.dtype.kind in "USO" or got.dtype.kind in "USO":
        return _compare_strings(name, got, want)
    if want.dtype.kind in "fc":
        return _compare_floats(name, got, want, tolerance)
    return _compare_integers(name, got, want, tolerance, scores)


def compare_outputs(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], tolerance: Tolerance,
                    index_scores: Mapping[str, str] | None = None) -> tuple[OutputParity, ...]:
    """Compare every output of the reference `want` with `got`, matched by name (never by position).

    Args:
        got: the artifact's outputs by name; extra names are ignored, a missing one fails its row.
        want: the reference's outputs by name, each [N, ...].
        tolerance: the bound for float outputs.
        index_scores: {index output: float score output} (`task_metric.index_scores(want)`); None
            detects it from `want`.

    Returns:
        One row per reference output, in `want`'s order.
    """
    from tfship.pipeline.gate.task_metric import index_scores as find_index_scores

    pairs = find_index_scores(want) if index_scores is None else index_scores
    rows = []
    for name, expected in want.items():
        if name not in got:
            rows.append(OutputParity(name, float("inf"), float("inf"), "present", False,
                                     f"missing from the artifact's outputs {sorted(got)}"))
            continue
        scores = want.get(pairs.get(name, ""))
        rows.append(compare_output(name, got[name], expected, tolerance,
                                   None if scores is None else np.asarray(scores)))
    return tuple(rows)


def failures(rows: tuple[OutputParity, ...] | list[OutputParity]) -> list[str]:
    """The failure reason of every failed row (empty when all passed)."""
    return [row.describe() for row in rows if not row.passed]
