"""Compare one pair of answers to the same request, output by output: the gate's rules, for one live pair.

The offline gate (`tfship.pipeline.gate.compare`) judges an artifact against the SavedModel over a golden set.
The serving floor cannot import the pipeline (docs/architecture.md), yet a shadowed request must be judged by
the same rules, so this module holds the per-pair primitive both floors can reach, `compare_pair`. Its rules
are the gate's, with the reference's noise taken as 0 (a live pair has no repeated reference calls to
measure it from):

* outputs are matched by name, never by position; an output the primary has and the shadow lacks fails;
  a shape that differs fails;
* float outputs: the value bound is the gate's |got - want| <= atol * max(1, max |want|) + rtol * |want|
  elementwise (the absolute part follows the output's range). NaN and Inf are judged against the primary's
  own values: the same non-finite value at the same place (NaN with NaN, +inf with +inf) agrees (a client's NaN
  input makes the primary's NaN too); NaN or Inf in the shadow's answer where the primary's is finite fails, and
  so does a primary's NaN/Inf the shadow does not repeat;
* a float [N, C] output (C > 1) also reports its top-1 agreement: rows whose argmax equals the primary's, a
  flip counted as agreeing when it is a *tie*: the primary's scores at its top class and at the shadow's differ
  by no more than the two scores' bounds together (the gate's rule for index outputs). The gate's decision rule
  (`gate.compare.decision`) takes the artifact's error from the 99th percentile of |got - want| over a golden
  set of hundreds of rows; a live pair is often one row, where that percentile is the flip's own error and
  would excuse every flip, so the pair uses the bound instead;
* integer outputs must be equal, except an index output [N] that points into a float [N, C] output of the
  primary (its argmax): a differing index agrees when the primary's scores at both indices differ by no more
  than the two scores' bounds together, as the gate's index rule;
* string outputs: exactly equal (bytes and str compared as UTF-8 text).

`tests/core/test_parity.py` checks these verdicts against `gate.compare.compare_outputs` on the same arrays.
Nothing here imports TensorFlow. Shapes: every array is [N, ...] with the batch on dimension 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

DEFAULT_ATOL = 1e-5  # the gate's float32 family (validate.atol / validate.rtol defaults)
DEFAULT_RTOL = 1e-5


@dataclass(frozen=True)
class PairBound:
    """The gate's value bound: |got - want| <= atol * max(1, max |want|) + rtol * |want| (elementwise).

    atol: fraction of the output's range (dimensionless); rtol: fraction of each reference value.
    """

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL

    def scale(self, want: np.ndarray) -> float:
        """max(1, max |want|) over the finite values: the range the absolute part is scaled by."""
        finite = np.abs(want[np.isfinite(want)]) if want.size else want
        return max(1.0, float(np.max(finite))) if finite.size else 1.0

    def allowed(self, want: np.ndarray) -> np.ndarray:
        """The allowed absolute error per element of `want` (same shape)."""
        return self.atol * self.scale(want) + self.rtol * np.abs(want)


@dataclass(frozen=True)
class OutputPair:
    """One output of one shadowed pair.

    max_abs_error: largest |shadow - primary| (float outputs), largest index distance (integers), count of
    differing strings; inf when missing or of another shape. within_bound: the gate's verdict on the values.
    excess: max(|error| / allowed) for floats (> 1 means outside the bound); for exact outputs 0 or inf.
    rows: N; top1_agreeing: rows whose decision agrees, ties counted as agreeing (None: not a decision).
    """

    output: str
    max_abs_error: float
    within_bound: bool
    excess: float
    rows: int
    top1_agreeing: int | None = None
    detail: str = ""


def as_text(array: np.ndarray) -> np.ndarray:
    """Strings or bytes as str (UTF-8, undecodable bytes replaced), for exact comparison."""
    flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in np.asarray(array).reshape(-1)]
    return np.array(flat, dtype=object).reshape(np.shape(array))


def same_nonfinite(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise: both NaN, or both the same infinity (+inf with +inf, -inf with -inf); same shape."""
    return (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))


def top1_agreeing(got: np.ndarray, want: np.ndarray, bound: PairBound, rows_equal: np.ndarray | None = None) -> int:
    """Rows of float [N, C] outputs whose argmax agrees, a flip counted as agreeing when the primary's scores at
    both classes are equal within the two scores' bounds together (a tie).

    A row holding NaN or Inf (either side) has no meaningful argmax: it agrees exactly when `rows_equal` says the
    shadow's row is the primary's (the same non-finite values at the same places, the rest within the bound);
    without `rows_equal` such a row agrees only when every value is the same non-finite value or equal.
    """
    if not len(want):
        return 0
    finite_rows = np.all(np.isfinite(want), axis=1) & np.all(np.isfinite(got), axis=1)
    if rows_equal is None:
        rows_equal = np.all(same_nonfinite(got, want) | (got == want), axis=1)
    safe_want, safe_got = np.where(finite_rows[:, None], want, 0.0), np.where(finite_rows[:, None], got, 0.0)
    mine, theirs = np.argmax(safe_want, axis=1), np.argmax(safe_got, axis=1)
    rows = np.arange(len(want))
    top, picked = safe_want[rows, mine], safe_want[rows, theirs]
    limit = 2.0 * bound.atol * bound.scale(want) + bound.rtol * (np.abs(top) + np.abs(picked))
    agree_finite = (mine == theirs) | (top - picked <= limit)
    return int(np.sum(np.where(finite_rows, agree_finite, rows_equal)))


def _floats(name: str, got: np.ndarray, want: np.ndarray, bound: PairBound) -> OutputPair:
    """Values within the bound where both are finite; where either is NaN or Inf the shadow must hold the
    primary's own non-finite value (a primary's NaN, e.g. from a client's NaN input, is no fault of the shadow's).
    """
    rows = len(want) if want.ndim else 1
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    both_finite = np.isfinite(want64) & np.isfinite(got64)
    mismatched = ~both_finite & ~same_nonfinite(got64, want64)
    error = np.abs(np.where(both_finite, got64, 0.0) - np.where(both_finite, want64, 0.0))
    error = np.where(mismatched, np.inf, error)
    allowed = np.where(both_finite, bound.allowed(np.where(both_finite, want64, 0.0)), 1.0)
    excess = float(np.max(error / np.maximum(allowed, 1e-300))) if error.size else 0.0
    outside_mask = (error > allowed) | mismatched
    top1 = None
    if want.ndim == 2 and want.shape[1] > 1:
        top1 = top1_agreeing(got64, want64, bound, ~np.any(outside_mask, axis=1))
    outside = int(np.sum(outside_mask))
    return OutputPair(name, float(error.max()) if error.size else 0.0, outside == 0, excess, rows, top1,
                      _float_detail(got64, want64, mismatched, outside))


def _float_detail(got: np.ndarray, want: np.ndarray, mismatched: np.ndarray, outside: int) -> str:
    """Why a float output is outside: the shadow's NaN/Inf where the primary is finite, a primary's non-finite
    value the shadow does not repeat, or values outside the bound (counts).
    """
    parts = []
    own = int(np.sum(mismatched & np.isfinite(want)))
    if own:
        parts.append(f"NaN or Inf in the shadow's output where the primary's is finite ({own} values)")
    if int(np.sum(mismatched)) - own:
        parts.append(f"{int(np.sum(mismatched)) - own} of the primary's NaN/Inf values not repeated by the shadow")
    rest = outside - int(np.sum(mismatched))
    if rest:
        parts.append(f"{rest} of {got.size} values outside the bound")
    return "; ".join(parts)


def _integers(name: str, got: np.ndarray, want: np.ndarray, bound: PairBound,
              scores: np.ndarray | None) -> OutputPair:
    rows = len(want) if want.ndim else 1
    differ = got != want
    distance = np.abs(got.astype(np.int64) - want.astype(np.int64))
    unexplained = differ
    if differ.any() and scores is not None:
        picked_got = np.clip(got.astype(np.int64), 0, scores.shape[1] - 1)
        index = np.arange(len(want))
        at_got, at_want = scores[index, picked_got], scores[index, want.astype(np.int64)]
        limit = 2.0 * bound.atol * bound.scale(scores) + bound.rtol * (np.abs(at_got) + np.abs(at_want))
        valid = (got >= 0) & (got < scores.shape[1])
        unexplained = differ & ~(valid & (np.abs(at_got - at_want) <= limit))
    bad = int(unexplained.sum())
    top1 = rows - int(unexplained.sum()) if want.ndim == 1 else None
    largest = float(distance.max()) if distance.size else 0.0
    return OutputPair(name, largest, bad == 0, 0.0 if bad == 0 else float("inf"), rows, top1,
                      f"{bad} of {differ.size} values differ" if bad else "")


def _index_scores(want: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{integer [N] output: the float [N, C] output of `want` it is the argmax of}."""
    floats = {k: v for k, v in want.items() if v.dtype.kind == "f" and v.ndim == 2 and v.shape[1] > 1}
    out = {}
    for name, value in want.items():
        if value.dtype.kind not in "iu" or value.ndim != 1:
            continue
        for scores in floats.values():
            if len(scores) == len(value) and np.array_equal(np.argmax(scores, axis=1), value):
                out[name] = scores.astype(np.float64)
                break
    return out


def compare_pair(shadow: Mapping[str, np.ndarray], primary: Mapping[str, np.ndarray],
                 bound: PairBound = PairBound()) -> tuple[OutputPair, ...]:
    """Compare the shadow's answer with the primary's, one row per primary output (rules: module docstring).

    Args:
        shadow: the shadow version's outputs by name, each [N, ...]; extra names are ignored.
        primary: the primary's outputs by name (the reference), each [N, ...].
        bound: the value bound for float outputs (and for ties of index outputs).
    """
    index_scores = _index_scores(primary)
    rows = []
    for name, want in primary.items():
        want = np.asarray(want)
        n = len(want) if want.ndim else 1
        if name not in shadow:
            rows.append(OutputPair(name, float("inf"), False, float("inf"), n, 0 if want.ndim in (1, 2) else None,
                                   f"missing from the shadow's outputs {sorted(shadow)}"))
            continue
        got = np.asarray(shadow[name])
        if got.shape != want.shape:
            rows.append(OutputPair(name, float("inf"), False, float("inf"), n, 0 if want.ndim in (1, 2) else None,
                                   f"shape {list(got.shape)}, primary {list(want.shape)}"))
        elif want.dtype.kind in "USO" or got.dtype.kind in "USO":
            differ = as_text(got) != as_text(want)
            excess = float("inf") if differ.any() else 0.0
            rows.append(OutputPair(name, float(differ.sum()), not differ.any(), excess, n, None,
                                   f"{int(differ.sum())} strings differ" if differ.any() else ""))
        elif want.dtype.kind in "fc":
            rows.append(_floats(name, got, want, bound))
        else:
            rows.append(_integers(name, got, want, bound, index_scores.get(name)))
    return tuple(rows)
