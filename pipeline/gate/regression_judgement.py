"""Regression judged like the other tasks: paired changes in MAE and RMSE with confidence bounds, and a stated
bound on the per-row error.

A regression candidate (a quantized TFLite file, an ONNX export) and the SavedModel predict the same held-out
rows, so the change of their errors is measured **paired**, row by row, against the labels (or, without labels,
the SavedModel's own predictions):

* **MAE change**: d_i = mean over row i's values of (|candidate - label| - |SavedModel - label|); the change is
  mean(d), its bounds mean(d) -/+ t * sd(d) / sqrt(N), Student's t at 1 - (1 - c) / 2 on each side (so each end
  holds at c, as for the accuracy drop, `confidence.decide_drop`);
* **RMSE change**: the same paired bounds on the change of the mean squared error, s_i = (candidate - label)^2 -
  (SavedModel - label)^2, carried through the square root: RMSE_c - RMSE_r, bounds sqrt(MSE_r + low) - RMSE_r and
  sqrt(MSE_r + high) - RMSE_r;
* each change is **refused** when its lower bound exceeds the allowance, **passed** when its upper bound is within
  it, **undecided** otherwise (`validate.undecided` decides, as for classification). The allowance is in label
  units: `validate.regression_max_error_increase` times the labels' standard deviation;
* **per-row error**: the share of rows whose largest |candidate - SavedModel| exceeds a bound,
  `validate.regression_row_error_share` (default 0.1) times the SavedModel's own MAE (without labels, or a perfect
  fit: times the labels' standard deviation), judged against 1 - `validate.regression_row_quantile` (default 0.01:
  the 99th percentile) with an exact binomial test at the same one-sided level: **passed** when so few rows exceed
  it that, at `validate.confidence`, fewer than 1 row in 100 would (the 99th percentile is within the bound);
  **refused** when so many do that more than 1 in 100 would; **undecided** otherwise (a distribution-free
  statement: zero rows over the bound needs ln(0.025) / ln(0.99) = 368 rows to pass at 95 %). A quantile of 1
  means every row: passed when none exceeds. In words: on 99 rows of 100 the file moves a prediction by at most a
  tenth of the model's own typical error. An averaged metric can improve while single rows go far off (errors
  that cancel); this rule refuses that.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from tfship.pipeline.gate.confidence import PASSED, REFUSED, UNDECIDED, verdict_of

__all__ = ["PairedChange", "RegressionDecision", "decide_regression", "paired_change", "row_share_verdict"]

_SEVERITY = {PASSED: 0, UNDECIDED: 1, REFUSED: 2}
PAIRED_T = "paired Student's t"


@dataclass(frozen=True)
class PairedChange:
    """One error metric's change, candidate minus SavedModel, in label units.

    verdict: `refused`, `passed` or `undecided`; reference, candidate: the metric of each; estimate: their
    difference; low, high: its bounds (each one-sided at 1 - (1 - confidence) / 2); allowed: the allowance;
    rows_to_decide: rows that would decide at the observed mean and spread (None: decided, or none would).
    """

    metric: str
    verdict: str
    reference: float
    candidate: float
    estimate: float
    low: float
    high: float
    allowed: float
    rows_to_decide: int | None = None

    def describe(self, output: str, confidence: float, rows: int) -> str:
        """e.g. `MAE on output 'y' 50.63 -> 53.90, change +3.27 (95 % bounds 2.10 to 4.44) on 106 rows: refused
        against the allowed +1.54`.
        """
        text = (f"{self.metric} on output '{output}' {self.reference:.4g} -> {self.candidate:.4g}, change "
                f"{self.estimate:+.3g} ({100 * confidence:g} % bounds {self.low:+.3g} to {self.high:+.3g}) on {rows} "
                f"rows: {self.verdict} against the allowed +{self.allowed:.3g}")
        if self.verdict == UNDECIDED:
            text += (f"; about {self.rows_to_decide} rows would decide" if self.rows_to_decide
                     else "; the change sits on the allowance, no number of rows decides")
        return text


def _bounds(values: np.ndarray, one_sided: float) -> tuple[float, float, float, float]:
    """(mean, low, high, sd) of the per-row differences `values`, Student's t at `one_sided` per end."""
    from scipy.stats import t  # here, not at import: the TF-free CLI imports the gate's modules

    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, -math.inf, math.inf, math.inf
    sd = float(np.std(values, ddof=1))
    half = float(t.ppf(one_sided, len(values) - 1)) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half, sd


def _rows_to_decide(mean: float, sd: float, allowed: float, one_sided: float) -> int | None:
    """Rows at which mean -/+ z * sd / sqrt(N) would clear `allowed` (normal approximation)."""
    from scipy.stats import norm

    gap = abs(allowed - mean)
    if gap <= 0.0 or not math.isfinite(sd):
        return None
    return max(3, math.ceil((float(norm.ppf(one_sided)) * sd / gap) ** 2))


def paired_change(reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray, allowed: float,
                  confidence: float, squared: bool = False) -> PairedChange:
    """The paired change of MAE (or, `squared`, RMSE) from the SavedModel's to the candidate's predictions.

    Args:
        reference, candidate, labels: [N, ...] of one shape (float); allowed: the allowance in label units;
        confidence: e.g. 0.95.
    """
    rows = len(labels)
    ref_err, cand_err = (reference - labels).reshape(rows, -1), (candidate - labels).reshape(rows, -1)
    one_sided = 1.0 - (1.0 - confidence) / 2.0
    if not squared:
        per_row = np.mean(np.abs(cand_err) - np.abs(ref_err), axis=1)
        mean, low, high, sd = _bounds(per_row, one_sided)
        ref_mae, cand_mae = float(np.mean(np.abs(ref_err))), float(np.mean(np.abs(cand_err)))
        verdict = verdict_of(low, high, allowed)
        needed = _rows_to_decide(mean, sd, allowed, one_sided) if verdict == UNDECIDED else None
        return PairedChange("MAE", verdict, ref_mae, cand_mae, cand_mae - ref_mae, low, high, allowed, needed)
    per_row = np.mean(cand_err ** 2 - ref_err ** 2, axis=1)
    mean, low, high, sd = _bounds(per_row, one_sided)
    mse = float(np.mean(ref_err ** 2))
    ref_rmse, cand_rmse = math.sqrt(mse), math.sqrt(max(0.0, mse + mean))

    def rmse_change(delta: float) -> float:
        return math.sqrt(max(0.0, mse + delta)) - ref_rmse if math.isfinite(delta) else delta

    low_rmse, high_rmse = rmse_change(low), rmse_change(high)
    verdict = verdict_of(low_rmse, high_rmse, allowed)
    # the allowance in MSE units: (RMSE_r + allowed)^2 - MSE_r, so the rows needed follow the squared errors
    needed = _rows_to_decide(mean, sd, (ref_rmse + allowed) ** 2 - mse, one_sided) if verdict == UNDECIDED else None
    return PairedChange("RMSE", verdict, ref_rmse, cand_rmse, cand_rmse - ref_rmse, low_rmse, high_rmse, allowed,
                        needed)


@dataclass(frozen=True)
class RegressionDecision:
    """A regression candidate's judgement (module docstring).

    mae, rmse: the paired changes; quantile: the per-row quantile judged (0.99); row_error: that quantile of
    the rows' largest |candidate - SavedModel|; row_bound: the bound it is held to; row_bound_basis: what the
    bound is made of, in words; label_std: the labels' standard deviation; confidence; rows.
    """

    mae: PairedChange
    rmse: PairedChange
    quantile: float
    row_error: float
    row_bound: float
    row_bound_basis: str
    label_std: float
    confidence: float
    rows: int
    rows_over_bound: int = 0
    row_verdict: str = PASSED
    row_rows_to_decide: int | None = None

    @property
    def verdict(self) -> str:
        """The most severe of the MAE, RMSE and per-row verdicts."""
        return max((self.mae.verdict, self.rmse.verdict, self.row_verdict), key=_SEVERITY.__getitem__)

    def severity(self) -> tuple[int, float]:
        return _SEVERITY[self.verdict], self.row_error / max(self.row_bound, 1e-300)

    def describe_rows(self, output: str) -> str:
        """The per-row rule in plain words, with its figures and its verdict."""
        percent, share = f"{100 * self.quantile:g}", f"{100 * (1 - self.quantile):.3g}"
        figures = (f"per-row error on output '{output}': {percent}th percentile of |artifact - SavedModel| "
                   f"{self.row_error:.3g} {'over' if self.row_error > self.row_bound else 'within'} the bound "
                   f"{self.row_bound:.3g} ({self.row_bound_basis}; validate.regression_row_error_share); "
                   f"{self.rows_over_bound} of {self.rows} rows over it")
        level = f"{100 * self.confidence:g} %"
        if self.row_verdict == REFUSED:
            return (f"{figures}: refused, at {level} confidence more than {share} % of rows would be (the "
                    f"artifact may move a prediction by at most that much on {percent} rows of 100)")
        if self.row_verdict == UNDECIDED:
            more = (f"about {self.row_rows_to_decide} rows would decide" if self.row_rows_to_decide
                    else "no number of rows decides at this share")
            return (f"{figures}: undecided, {self.rows} rows cannot show at {level} confidence whether more or "
                    f"fewer than {share} % of rows are; {more}")
        return f"{figures}: passed at {level} confidence (at most {share} % of rows over it)"

    def describe(self, output: str) -> list[str]:
        """Each rule that did not pass, described (`verdict` says whether it refuses)."""
        out = [change.describe(output, self.confidence, self.rows) for change in (self.mae, self.rmse)
               if change.verdict != PASSED]
        return out + ([self.describe_rows(output)] if self.row_verdict != PASSED else [])

    def to_json(self) -> dict:
        return asdict(self)


def decide_regression(reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray, label_std: float,
                      max_increase: float, quantile: float, row_share: float, confidence: float,
                      reference_mae: float | None = None) -> RegressionDecision:
    """Judge a regression candidate's predictions against the SavedModel's on the same rows (module docstring).

    Args:
        reference, candidate: [N, ...] predictions; labels: [N, ...] targets (or the SavedModel's predictions);
        label_std: the labels' standard deviation; max_increase: `validate.regression_max_error_increase` (label
        std); quantile: `validate.regression_row_quantile`; row_share: `validate.regression_row_error_share`;
        confidence: `validate.confidence`; reference_mae: the SavedModel's MAE at its largest batch size (None:
        measured on `reference`).

    Raises:
        ValueError: the three arrays hold different numbers of values.
    """
    reference, candidate = np.asarray(reference, np.float64), np.asarray(candidate, np.float64)
    labels = np.asarray(labels, np.float64)
    if not reference.size == candidate.size == labels.size:
        raise ValueError(f"regression: {reference.size} SavedModel values, {candidate.size} artifact values, "
                         f"{labels.size} labels")
    rows = len(labels)
    reference, candidate = reference.reshape(labels.shape), candidate.reshape(labels.shape)
    allowed = max_increase * label_std
    mae = paired_change(reference, candidate, labels, allowed, confidence)
    rmse = paired_change(reference, candidate, labels, allowed, confidence, squared=True)
    per_row = np.max(np.abs(candidate - reference).reshape(rows, -1), axis=1) if rows else np.zeros(1)
    row_error = float(np.quantile(per_row, quantile))
    own = mae.reference if reference_mae is None else reference_mae
    if own > 0.0:
        bound, basis = row_share * own, f"{row_share:g} x the SavedModel's own MAE {own:.4g}"
    else:
        bound, basis = row_share * label_std, f"{row_share:g} x the labels' standard deviation {label_std:.4g}"
    over = int(np.sum(~(per_row <= bound))) if rows else 0  # NaN counts as over
    verdict, needed = row_share_verdict(over, rows, 1.0 - quantile, 1.0 - (1.0 - confidence) / 2.0)
    return RegressionDecision(mae, rmse, quantile, row_error, bound, basis, label_std, confidence, rows, over,
                              verdict, needed)


def row_share_verdict(over: int, rows: int, share: float, one_sided: float) -> tuple[str, int | None]:
    """(verdict, rows that would decide) of "at most `share` of rows exceed the bound", `over` of `rows` seen.

    Exact binomial tails at the true share `share`: passed when P(X <= over) <= 1 - one_sided, refused when
    P(X >= over) <= 1 - one_sided, else undecided (then the smallest row count, at the observed share of rows
    over, that would decide: None if the observed share is `share` itself). `share` 0 (quantile 1, every row):
    passed when none exceeds, refused otherwise.
    """
    from scipy.stats import binom

    if share <= 0.0 or rows == 0:
        return (PASSED if over == 0 else REFUSED), None
    alpha = 1.0 - one_sided
    if binom.cdf(over, rows, share) <= alpha:
        return PASSED, None
    if binom.sf(over - 1, rows, share) <= alpha:
        return REFUSED, None
    observed = over / rows
    if over == 0:  # exact: (1 - share)^N <= alpha
        return UNDECIDED, math.ceil(math.log(alpha) / math.log1p(-share))
    if observed == share:
        return UNDECIDED, None
    for candidate in (int(rows * 1.1 ** k) + 1 for k in range(1, 200)):
        seen = round(observed * candidate)
        if (binom.cdf(seen, candidate, share) <= alpha if observed < share
                else binom.sf(seen - 1, candidate, share) <= alpha):
            return UNDECIDED, candidate
        if candidate > 10_000_000:
            break
    return UNDECIDED, None
