"""Rules on one float output that need no tolerance object: saturation at a quantization limit, whether an
output looks like probabilities, and the top-1 decision agreement of a float [N, C] output (rules in
`pipeline.gate.compare`'s module docstring). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SATURATION_MARGIN", "SATURATION_RANGE", "SATURATION_SHARE", "SATURATION_STEPS", "TIE_ERROR_QUANTILE",
           "decision", "is_distribution", "is_multi_label", "label_flips", "saturation"]

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
# The artifact's error bound used for decision ties: this quantile of |artifact - reference| over the output.
TIE_ERROR_QUANTILE = 0.99


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


def is_distribution(want: np.ndarray) -> bool:
    """Whether a float [N, C] output looks like probabilities: every value in [0, 1], every row summing to 1."""
    if want.ndim != 2 or want.shape[1] < 2 or not want.size or not np.all(np.isfinite(want)):
        return False
    return bool(np.all(want >= 0.0) and np.all(want <= 1.0) and np.allclose(want.sum(axis=1), 1.0, atol=1e-3))


def decision(got: np.ndarray, want: np.ndarray) -> tuple[float, float, float, int]:
    """Top-1 agreement of `got` with `want` (both float [N, C]) and how flat the reference is.

    A row is a tie when the reference's margin between its top class and the artifact's (or, when they
    agree, its runner-up) is at most twice the artifact's measured error (the `TIE_ERROR_QUANTILE` of
    |got - want| over the output): both scores may move by that much.

    Returns:
        (agreement in % of rows; the same with flipped ties counted as agreeing; share of rows that are ties,
        in [0, 1]; rows whose argmax differs).
    """
    error = np.abs(got - want)
    bound = float(np.quantile(error, TIE_ERROR_QUANTILE)) if error.size else 0.0
    mine, theirs = np.argmax(want, axis=1), np.argmax(got, axis=1)
    rows = np.arange(len(want))
    runner_up = np.sort(want, axis=1)[:, -2]
    other = np.where(mine == theirs, runner_up, want[rows, theirs])
    ties = want[rows, mine] - other <= 2.0 * bound
    flips = mine != theirs
    if not len(want):
        return 100.0, 100.0, 0.0, 0
    return (100.0 * float(np.mean(~flips)), 100.0 * float(np.mean(~flips | ties)), float(np.mean(ties)),
            int(flips.sum()))


def is_multi_label(want: np.ndarray) -> bool:
    """Whether a float [N, K] output (K >= 2) looks like independent sigmoid probabilities: every value in
    [0, 1] and not every row summing to 1 (`is_distribution`).
    """
    if want.ndim != 2 or want.shape[1] < 2 or not want.size or not np.all(np.isfinite(want)):
        return False
    return bool(np.all(want >= 0.0) and np.all(want <= 1.0)) and not is_distribution(want)


def label_flips(got: np.ndarray, want: np.ndarray, threshold: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a multi-label output [N, K] with a label decision (value > `threshold`) that differs from the
    reference's, and which of them flip only within the artifact's measured error (the reference within twice
    the `TIE_ERROR_QUANTILE` of |got - want| of the threshold).

    Returns:
        (rows with a flipped label [N] bool, rows whose flips are all such ties [N] bool).
    """
    error = np.abs(got - want)
    bound = float(np.quantile(error, TIE_ERROR_QUANTILE)) if error.size else 0.0
    flips = (got > threshold) != (want > threshold)
    real = flips & (np.abs(want - threshold) > 2.0 * bound)
    flipped = np.any(flips, axis=1)
    return flipped, flipped & ~np.any(real, axis=1)
