"""The one output comparison: every gate (validate, the behaviour checks, serve-check) judges an
artifact's outputs against the reference's with `compare_outputs`, per output, matched by name.

Rules (per output):

* float outputs: every element must satisfy |got - want| <= atol * scale + rtol * |want| + m * noise,
  where scale = max(1, max |want|) over that output (the tolerance follows the output's range, so an output
  around 12.6 allows 12.6x the absolute error of an output around 1) and noise is the largest difference the
  reference shows against itself on that output (batch sizes, repeated calls; `pipeline.gate.validate.reference_noise`),
  times `Tolerance.noise_multiplier` m: a difference the reference shows against itself never fails;
  NaN or Inf fails; an output
  pinned at a limit the reference goes beyond (an int8 output saturating at its quantization range,
  e.g. every log-probability below -16 coming back as exactly -15.9375) fails as `saturated`, naming
  the limit, even when the values are within a loosened bound (`SATURATION_MARGIN`);
* a float [N, C] output of scores (probabilities, the scores an index output points into, or the task's
  score output) whose bound is vacuous (at least `VACUOUS_SHARE` of the median spread of a row, e.g.
  10 % of the range against softmax probabilities of a 1,000-class model that never exceed 0.01) is judged
  by its decision as well: the top-1 agreement with the reference must reach the mode's floor
  (`Tolerance.min_top1_agreement`), and when more than `Tolerance.max_tie_share` of the rows have their
  reference top two within the artifact's measured error, the output is too flat to judge and fails;
* integer outputs: exactly equal, except index outputs into the model's own scores (an integer [N] argmax
  or [N, k] top-k / argsort output of a float [N, C] output of the reference, `task_metric.index_scores`),
  where a differing index passes when the reference's scores at both indices differ by no more than the two
  scores' bounds together: indices are equal when the values they select are equal within the bound;
* string outputs: exactly equal (bytes and str compare as UTF-8 text, as TF Serving's `string_val`).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from tfship.pipeline.conversion.artifacts import as_text
from tfship.pipeline.gate.confidence import REFUSED, decide_share
from tfship.pipeline.gate.value_rules import (
    SATURATION_MARGIN,
    TIE_ERROR_QUANTILE,
    decision,
    is_distribution,
    is_multi_label,
    label_flips,
    saturation,
)

__all__ = ["ERROR_BIN_EDGES", "SATURATION_MARGIN", "TIE_ERROR_QUANTILE", "OutputParity", "Tolerance", "as_text",
           "compare_output", "compare_outputs", "decision", "failures", "is_distribution", "saturation", "vacuous"]

# Absolute-error histogram bins: [0, 1e-9), [1e-9, 1e-8), ..., [1e1, inf).
ERROR_BIN_EDGES = (0.0, *(10.0 ** e for e in range(-9, 2)), float("inf"))
# A float [N, C] output's bound is vacuous when it is at least this share of the median spread (max - min) of
# a row of the reference: it cannot tell the row's values apart, so the decision (argmax) is judged instead.
VACUOUS_SHARE = 0.5


@dataclass(frozen=True)
class Tolerance:
    """A per-output bound: |got - want| <= atol * max(1, max |want|) + rtol * |want| + noise_multiplier * noise
    (elementwise), noise being the reference's own largest difference on that output (0 when not measured).

    atol: fraction of the output's range (dimensionless); rtol: fraction of each reference value;
    outliers: the share of an output's elements allowed beyond the bound (0 for float modes; quantized modes
    allow a few values just outside the calibrated range, e.g. 0.001 = 0.1 %); noise_multiplier: how many
    times the reference's own noise is allowed on top; mode: the artifact's mode (named in messages);
    setting: the config key that loosens this bound (named in failure messages); min_top1_agreement: the
    floor (%) of top-1 agreement of an output whose bound is vacuous (None: no decision judged);
    max_tie_share: the largest share of rows whose reference top two are within the artifact's error before
    the output is too flat to judge; implementation_multiplier: how many times the reference's own float32
    rounding error (`pipeline.gate.noise.ImplementationNoise`) is allowed on top (float32 mode; 0 elsewhere);
    integer_share: the share of rows an integer output derived from floats (a count, a flag, a bucket) may
    differ on, decided with `confidence` (`pipeline.gate.confidence.decide_share`; None: equal, float32 mode).
    """

    atol: float
    rtol: float
    outliers: float = 0.0
    noise_multiplier: float = 2.0
    mode: str = ""
    setting: str = ""
    min_top1_agreement: float | None = None
    max_tie_share: float = 0.05
    implementation_multiplier: float = 0.0
    integer_share: float | None = None
    confidence: float = 0.95

    def scale(self, want: np.ndarray) -> float:
        """max(1, max |want|): the output's range the absolute part is scaled by."""
        finite = np.abs(want[np.isfinite(want)]) if want.size else want
        return max(1.0, float(np.max(finite))) if finite.size else 1.0

    def absolute(self, want: np.ndarray, noise: float = 0.0, implementation: float = 0.0) -> float:
        """The part of the bound that does not follow each value: atol * scale + the two noise terms."""
        return (self.atol * self.scale(want) + self.noise_multiplier * noise
                + self.implementation_multiplier * implementation)

    def bound(self, want: np.ndarray, noise: float = 0.0, implementation: float = 0.0) -> np.ndarray:
        """The allowed absolute error per element (same shape as `want`); `noise` is the reference's own
        batch noise, `implementation` its own float32 rounding error (both in the output's unit).
        """
        return self.absolute(want, noise, implementation) + self.rtol * np.abs(want)

    def describe(self, want: np.ndarray, noise: float = 0.0, implementation: float = 0.0) -> str:
        """e.g. `atol 1e-05*12.6 + rtol 1e-05 + 2x reference noise 3.1e-06 + 4x implementation noise 2e-06`."""
        text = f"atol {self.atol:g}*{self.scale(want):.3g} + rtol {self.rtol:g}"
        text += f" + {self.noise_multiplier:g}x reference noise {noise:.2g}" if noise else ""
        text += (f" + {self.implementation_multiplier:g}x implementation noise {implementation:.2g}"
                 if implementation and self.implementation_multiplier else "")
        if not self.outliers:
            return text
        key = f"{self.setting.rsplit('.', 1)[0]}.outlier_fraction" if self.setting else "outlier_fraction"
        return text + f" (up to {100 * self.outliers:g} % of the output's elements may exceed it: {key})"


@dataclass(frozen=True)
class OutputParity:
    """One output of one artifact against the reference: max abs/rel error and the verdict.

    max_abs_error: largest |got - want| (float outputs), the largest index distance (integer outputs) or
    the count of differing strings; exact: an integer or string output (compared for equality);
    top1_agreement, tie_share: for a float [N, C] output judged by its decision (its bound is vacuous),
    the % of rows whose argmax equals the reference's and the share of rows whose reference top two lie
    within the artifact's measured error (None when the decision was not judged).
    """

    output: str
    max_abs_error: float
    max_rel_error: float
    tolerance: str
    passed: bool
    detail: str = ""
    error_histogram: tuple[int, ...] = ()
    exact: bool = False
    top1_agreement: float | None = None
    tie_share: float | None = None

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


def _compare_strings(name: str, got: np.ndarray, want: np.ndarray) -> OutputParity:
    differ = as_text(got) != as_text(want)
    return OutputParity(name, float(differ.sum()), 0.0, "exact (strings)", not differ.any(),
                        f"{int(differ.sum())} of {differ.size} strings differ" if differ.any() else "", exact=True)


def vacuous(want: np.ndarray, tolerance: Tolerance, noise: float = 0.0, implementation: float = 0.0) -> bool:
    """Whether the bound cannot tell a row's values apart: a float [N, C] output (C > 1) whose absolute bound
    is at least `VACUOUS_SHARE` of the median spread (max - min) of a reference row (e.g. 10 % of the range
    against softmax probabilities of a 1,000-class model). A median spread of 0 (most rows hold equal scores,
    no decision) is not vacuous: there is nothing but the values to judge.
    """
    if want.ndim != 2 or want.shape[1] < 2 or want.shape[0] == 0 or not np.all(np.isfinite(want)):
        return False
    spread = float(np.median(np.max(want, axis=1) - np.min(want, axis=1)))
    if spread == 0.0:  # rows whose scores are all equal hold no decision to judge (an untrained model's
        return False   # uniform softmax): the value bound judges them, and a file equal to them passes
    return tolerance.absolute(want, noise, implementation) >= VACUOUS_SHARE * spread


def _decision_details(got: np.ndarray, want: np.ndarray, tolerance: Tolerance,
                      bound: float) -> tuple[list[str], float, float]:
    agreement, excused, tie_share, flips = decision(got, want)
    classes, details = want.shape[1], []
    if tie_share > tolerance.max_tie_share:
        details.append(f"too flat to judge: {100 * tie_share:.1f} % of rows have their top two scores within the "
                       f"artifact's error (allowed {100 * tolerance.max_tie_share:g} %, validate.max_tie_share), "
                       f"and the value bound {bound:.3g} is vacuous against this {classes}-class output's row "
                       "spread; judge it on data the model separates, or leave this mode out")
    floor = tolerance.min_top1_agreement
    judged = None if floor is None else decide_share(round((100.0 - excused) * len(want) / 100.0), len(want),
                                                     (100.0 - floor) / 100.0, tolerance.confidence)
    if judged is not None and judged.verdict == REFUSED:  # the floor is shown missed, not merely on a few rows
        details.append(f"top-1 agreement {excused:.1f} % (ties counted as agreeing; {flips} of {len(want)} rows "
                       f"flip, {agreement:.1f} % agree) below the "
                       f"{tolerance.mode or 'mode'} floor {floor:g} % (validate.{tolerance.mode or '<family>'}"
                       f".min_top1_agreement; non-tie flips {judged.describe('', '% of rows')[1:]}); the "
                       f"value bound {bound:.3g} is vacuous against this {classes}-class output")
    return details, agreement, tie_share


def _multi_label_details(got: np.ndarray, want: np.ndarray, tolerance: Tolerance, floor: float) -> list[str]:
    """A multi-label output's decisions (each value against 0.5), as binary outputs are judged: refused when
    the share of rows with a flipped label (ties included: a file wrong by a lot makes every flip a tie of its
    own error) is shown above 100 % minus the mode's top-1 floor (`floor`: `tolerance.min_top1_agreement`), whatever
    the value tolerance.
    """
    flipped, ties = label_flips(got, want)
    judged = decide_share(int(flipped.sum()), len(want), (100.0 - floor) / 100.0,
                          tolerance.confidence)
    if judged.verdict != REFUSED:
        return []
    return [judged.describe("multi-label decisions at 0.5: rows with a flipped label", "% of rows")
            + f" ({int(ties.sum())} of them only within the artifact's error; "
            f"validate.{tolerance.mode}.min_top1_agreement)"]


def _compare_floats(name: str, got: np.ndarray, want: np.ndarray, tolerance: Tolerance,
                    noise: float, scores: bool, implementation: float = 0.0) -> OutputParity:
    if not np.all(np.isfinite(got)):
        bad = int(np.sum(~np.isfinite(got)))
        return OutputParity(name, float("nan"), float("nan"), "finite", False, f"NaN or Inf in output ({bad} values)")
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    error = np.abs(got64 - want64)
    max_abs = float(error.max()) if error.size else 0.0
    rel = float(np.max(error / np.maximum(np.abs(want64), 1e-12))) if error.size else 0.0
    bound = tolerance.bound(want64, noise, implementation)
    outside = error > bound
    pinned = saturation(got64, want64, SATURATION_MARGIN * tolerance.scale(want64), tolerance.scale(want64))
    allowed = int(tolerance.outliers * outside.size)
    details = [f"{int(outside.sum())} of {outside.size} elements outside tolerance"
               + (f" (at most {allowed} allowed)" if allowed else "")] if outside.sum() > allowed else []
    details += [pinned] if pinned else []
    agreement = tie_share = None
    if scores and tolerance.min_top1_agreement is not None and vacuous(want64, tolerance, noise, implementation):
        absolute = tolerance.absolute(want64, noise, implementation)
        judged, agreement, tie_share = _decision_details(got64, want64, tolerance, absolute)
        details += judged
    elif not scores and tolerance.min_top1_agreement is not None and is_multi_label(want64):
        details += _multi_label_details(got64, want64, tolerance, tolerance.min_top1_agreement)
    return OutputParity(name, max_abs, rel, tolerance.describe(want64, noise, implementation), not details,
                        "; ".join(details), error_histogram(error), top1_agreement=agreement, tie_share=tie_share)


def _unexplained_by_values(got: np.ndarray, want: np.ndarray, values: np.ndarray, tolerance: Tolerance,
                           noise: float) -> int:
    """Differing positions of a top-k index output [N, k] not explained by a tie: the artifact's index at
    (row, j) is a tie when the reference lists it at some (row, j') of the same row whose selected value
    equals the value at (row, j) within the bound (`values`: the reference's [N, k] selected values).
    """
    unexplained = 0
    limit = 2.0 * (tolerance.atol * tolerance.scale(values) + tolerance.noise_multiplier * noise)
    for row, column in zip(*np.nonzero(got != want), strict=True):
        where = np.nonzero(want[row] == got[row, column])[0]
        if not where.size or abs(values[row, where[0]] - values[row, column]) > limit + tolerance.rtol * (
                abs(values[row, where[0]]) + abs(values[row, column])):
            unexplained += 1
    return unexplained


def _compare_integers(name: str, got: np.ndarray, want: np.ndarray, tolerance: Tolerance,
                      scores: np.ndarray | None, score_noise: float, values: np.ndarray | None = None) -> OutputParity:
    differ = got != want
    distance = np.abs(got.astype(np.int64) - want.astype(np.int64))
    max_abs = float(np.max(distance)) if got.size else 0.0
    unexplained = int(differ.sum())
    if differ.any() and scores is not None and want.ndim in (1, 2):
        rows, columns = np.nonzero(differ.reshape(len(want), -1))
        picked_got = got.reshape(len(want), -1)[rows, columns].astype(np.int64)
        picked_want = want.reshape(len(want), -1)[rows, columns].astype(np.int64)
        valid = (picked_got >= 0) & (picked_got < scores.shape[1])
        at_got = scores[rows, np.clip(picked_got, 0, scores.shape[1] - 1)]
        at_want = scores[rows, picked_want]
        allowed = 2.0 * (tolerance.atol * tolerance.scale(scores) + tolerance.noise_multiplier * score_noise) \
            + tolerance.rtol * (np.abs(at_got) + np.abs(at_want))
        ties = valid & (np.abs(at_got - at_want) <= allowed)  # both scores may move by their own bound
        unexplained = int((~ties).sum())
    elif differ.any() and values is not None and want.ndim == 2:
        unexplained = _unexplained_by_values(got, want, values, tolerance, score_noise)
    indexed = scores is not None or values is not None
    if not indexed and tolerance.integer_share is not None and want.ndim >= 1 and len(want):
        return _integer_agreement(name, got, want, tolerance, tolerance.integer_share, max_abs,
                                  error_histogram(distance))
    detail = (f"{unexplained} of {differ.size} {'indices' if indexed else 'values'} differ"
              + (" (ties excluded: an index passes when the value it selects is equal within the bound)"
                 if indexed else "")) if unexplained else ""
    return OutputParity(name, max_abs, 0.0, "exact (by the values selected)" if indexed else "exact",
                        unexplained == 0, detail, error_histogram(distance), exact=True)


def _integer_agreement(name: str, got: np.ndarray, want: np.ndarray, tolerance: Tolerance, share: float,
                       max_abs: float, histogram: tuple[int, ...]) -> OutputParity:
    """An integer output a reduced-precision file derives from floats (a count of positive scores, a thresholded
    flag, a bucket index): a float within the file's error of a boundary moves it by one, so the rows it
    differs on are judged as a share with confidence (`confidence.decide_share`), not bit for bit: refused when
    the share is shown above `share` (`tolerance.integer_share`).
    """
    rows = np.any((got != want).reshape(len(want), -1), axis=1)
    judged = decide_share(int(rows.sum()), len(want), share, tolerance.confidence)
    detail = judged.describe("rows differing", "% of rows") + f" (validate.{tolerance.mode}.min_top1_agreement)"
    return OutputParity(name, max_abs, 0.0, f"agreement (rows differing at most {100 * share:g} %)",
                        judged.verdict != REFUSED, detail if judged.verdict == REFUSED else "", histogram, exact=True)


def compare_output(name: str, got: np.ndarray, want: np.ndarray, tolerance: Tolerance,
                   scores: np.ndarray | None = None, noise: float = 0.0, score_noise: float = 0.0,
                   values: np.ndarray | None = None, decides: bool | None = None,
                   implementation: float = 0.0) -> OutputParity:
    """Compare one named output with the reference's (rules in the module docstring).

    Args:
        got, want: the artifact's and the reference's arrays, same shape [N, ...].
        tolerance: the bound for float outputs (and for ties of index outputs).
        scores: for an index output ([N] argmax, [N, k] top-k or argsort), the reference's float [N, C]
            scores it points into; else None.
        noise: the reference's own largest difference on this output (same unit); score_noise: the same for
            `scores` (or `values`).
        values: for a top-k index output [N, k] whose scores are not an output, the reference's float
            [N, k] selected values (`task_metric.index_values`); else None.
        decides: whether this float output is scores whose argmax is a decision (judged by top-1 agreement
            when its bound is vacuous); None: when it looks like probabilities (`is_distribution`).
        implementation: the reference's own float32 rounding error on this output
            (`pipeline.gate.noise.ImplementationNoise.max_abs`), allowed `tolerance.implementation_multiplier` times.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return OutputParity(name, float("inf"), float("inf"), "shape", False,
                            f"shape {list(got.shape)}, expected {list(want.shape)}")
    if want.dtype.kind in "USO" or got.dtype.kind in "USO":
        return _compare_strings(name, got, want)
    if want.dtype.kind in "fc":
        return _compare_floats(name, got, want, tolerance, noise, is_distribution(want) if decides is None else decides,
                               implementation)
    return _compare_integers(name, got, want, tolerance, scores, score_noise,
                             None if values is None else np.asarray(values, dtype=np.float64))


def compare_outputs(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], tolerance: Tolerance,
                    index_scores: Mapping[str, str] | None = None, noise: Mapping[str, float] | None = None,
                    decisions: Collection[str] = (),
                    implementation_noise: Mapping[str, float] | None = None) -> tuple[OutputParity, ...]:
    """Compare every output of the reference `want` with `got`, matched by name (never by position).

    Args:
        got: the artifact's outputs by name; extra names are ignored, a missing one fails its row.
        want: the reference's outputs by name, each [N, ...].
        tolerance: the bound for float outputs.
        index_scores: {index output: float score output it points into} (`task_metric.index_scores(want)`);
            None detects it from `want`.
        noise: {output: the reference's own largest difference on it}
            (`pipeline.gate.validate.reference_noise`); None: 0.
        decisions: float outputs whose argmax is a decision (the task's score output), besides those an index
            output points into and those that look like probabilities (`is_distribution`).
        implementation_noise: {output: the reference's own float32 rounding error on it}
            (`pipeline.gate.noise.implementation_noise`); None: 0.

    Returns:
        One row per reference output, in `want`'s order.
    """
    from tfship.pipeline.gate.task_metric import index_scores as find_index_scores
    from tfship.pipeline.gate.task_metric import index_values

    pairs = find_index_scores(want) if index_scores is None else index_scores
    selected = {name: values for name, values in index_values(want).items() if name not in pairs}
    noise = noise or {}
    rows = []
    for name, expected in want.items():
        if name not in got:
            rows.append(OutputParity(name, float("inf"), float("inf"), "present", False,
                                     f"missing from the artifact's outputs {sorted(got)}"))
            continue
        score_name = pairs.get(name) or selected.get(name, "")
        scores = want.get(pairs.get(name, ""))
        rows.append(compare_output(name, got[name], expected, tolerance,
                                   None if scores is None else np.asarray(scores, dtype=np.float64),
                                   noise.get(name, 0.0), noise.get(score_name, 0.0),
                                   want.get(selected.get(name, "")),
                                   True if name in decisions or name in pairs.values() else None,
                                   (implementation_noise or {}).get(name, 0.0)))
    return tuple(rows)


def failures(rows: tuple[OutputParity, ...] | list[OutputParity]) -> list[str]:
    """The failure reason of every failed row (empty when all passed)."""
    return [row.describe() for row in rows if not row.passed]
