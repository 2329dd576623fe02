"""Decisions from counts of rows, with their uncertainty: exact binomial (Clopper-Pearson) bounds.

A loss measured on N held-out rows is a share of rows (rows the artifact gets wrong that the SavedModel gets
right, decisions that flip), so its uncertainty is a binomial one. Every such rule here returns one of three
verdicts at a confidence level c (`validate.confidence`, default 0.95):

* **refused**: the data show a loss larger than allowed (the lower bound exceeds the allowance);
* **passed**: the data show the loss is at most the allowance (the upper bound is within it);
* **undecided**: the interval holds the allowance: too few rows to tell (`validate.undecided` decides).

Accuracy drop (`decide_drop`): each row is one of: both right, both wrong, only the SavedModel right (b rows,
a loss), only the artifact right (c rows, a gain): the discordant pairs of McNemar's test. The drop is
p_b - p_c; its lower bound is CP_low(b) - CP_high(c) and its upper bound CP_high(b) - CP_low(c), each
Clopper-Pearson bound one-sided at (1 - c) / 2, so each end of the interval holds with probability at least
c (Bonferroni): a refusal is wrong, and a pass is wrong, at most 1 - c of the time. A share of flips
(`decide_share`, top-1 agreement, binary decisions, integer heads) is one proportion: CP_low(k), CP_high(k),
one-sided at 1 - c each.

`rows_to_decide` gives how many rows would decide at the rates observed (or, with no loss observed, how many
rows with none would show the allowance is kept: about 3.7 / allowance at 95 %, 736 rows for 0.5 points).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXACT", "REFUSED", "PASSED", "UNDECIDED", "Decision", "clopper_pearson", "decide_drop", "decide_share",
           "rows_to_decide", "verdict_of"]

REFUSED, PASSED, UNDECIDED = "refused", "passed", "undecided"
EXACT = "exact binomial (Clopper-Pearson)"
MAX_ROWS = 10_000_000  # rows_to_decide gives up beyond this (the rates sit on the allowance)


def clopper_pearson(successes: int, trials: int, one_sided: float) -> tuple[float, float]:
    """Exact binomial bounds (low, high) on a proportion from `successes` of `trials`; each bound one-sided at
    level `one_sided` (e.g. 0.975), so P(p < low) <= 1 - one_sided and P(p > high) <= 1 - one_sided.
    """
    if trials <= 0:
        return 0.0, 1.0
    from scipy.stats import beta  # here, not at import: the TF-free CLI imports the gate's modules to name its extra

    tail = 1.0 - one_sided
    low = 0.0 if successes <= 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes >= trials else float(beta.ppf(one_sided, successes + 1, trials - successes))
    return low, high


@dataclass(frozen=True)
class Decision:
    """One loss judged from counts of rows.

    verdict: `refused`, `passed` or `undecided`; estimate, low, high: the loss and its bounds (shares of rows,
    0.01 = 1 point); allowed: the allowance (same unit); confidence: the level; rows: rows judged;
    rows_to_decide: rows that would decide at the observed rates (None: no number would, or decided already);
    method: the rule that gave the bounds (exact binomial, or `auc_drop.DELONG` for a binary AUC drop).
    """

    verdict: str
    estimate: float
    low: float
    high: float
    allowed: float
    confidence: float
    rows: int
    rows_to_decide: int | None = None
    method: str = EXACT

    def describe(self, what: str, unit: str = "points") -> str:
        """e.g. `accuracy drop 3.12 points (95 % bounds -10.81 to 16.22) on 32 rows: undecided against the
        allowed 0.5; about 337 rows would decide` (`unit`: `points`, or `% of rows` for a share).
        """
        text = (f"{what} {100 * self.estimate:.2f} {unit} ({100 * self.confidence:g} % bounds "
                f"{100 * self.low:.2f} to {100 * self.high:.2f}) on {self.rows} rows: {self.verdict} against the "
                f"allowed {100 * self.allowed:g}")
        if self.verdict == UNDECIDED:
            text += (f"; about {self.rows_to_decide} rows would decide" if self.rows_to_decide
                     else "; the rates sit on the allowance, no number of rows decides")
        return text


def verdict_of(low: float, high: float, allowed: float) -> str:
    """`refused` when `low` exceeds `allowed`, `passed` when `high` is within it, else `undecided`."""
    return REFUSED if low > allowed else PASSED if high <= allowed else UNDECIDED


def _drop_bounds(worse: int, better: int, rows: int, confidence: float) -> tuple[float, float]:
    one_sided = 1.0 - (1.0 - confidence) / 2.0
    worse_low, worse_high = clopper_pearson(worse, rows, one_sided)
    better_low, better_high = clopper_pearson(better, rows, one_sided)
    return worse_low - better_high, worse_high - better_low


def rows_to_decide(worse_rate: float, better_rate: float, allowed: float, confidence: float,
                   paired: bool = True) -> int | None:
    """The fewest rows on which losses at `worse_rate` (and gains at `better_rate`, paired) would be decided
    (refused or passed); None when none up to `MAX_ROWS` would. Doubling search, then bisection.
    """
    def decided(rows: int) -> bool:
        worse, better = round(worse_rate * rows), round(better_rate * rows)
        low, high = (_drop_bounds(worse, better, rows, confidence) if paired
                     else clopper_pearson(worse, rows, confidence))
        return verdict_of(low, high, allowed) != UNDECIDED

    high = 16
    while not decided(high):
        high *= 2
        if high > MAX_ROWS:
            return None
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if decided(middle) else (middle, high)
    return high


def decide_drop(worse: int, better: int, rows: int, allowed: float, confidence: float) -> Decision:
    """Judge an accuracy drop from the discordant rows (module docstring).

    Args:
        worse: rows the SavedModel gets right and the artifact wrong; better: the reverse; rows: all rows.
        allowed: the allowed drop as a share of rows (0.005 = 0.5 points); confidence: e.g. 0.95.
    """
    low, high = _drop_bounds(worse, better, rows, confidence)
    verdict = verdict_of(low, high, allowed)
    needed = rows_to_decide(worse / max(rows, 1), better / max(rows, 1), allowed, confidence) \
        if verdict == UNDECIDED else None
    return Decision(verdict, (worse - better) / max(rows, 1), low, high, allowed, confidence, rows, needed)


def decide_share(count: int, rows: int, allowed: float, confidence: float) -> Decision:
    """Judge a share of rows that went wrong (flipped decisions) against `allowed` (module docstring)."""
    low, high = clopper_pearson(count, rows, confidence)
    verdict = verdict_of(low, high, allowed)
    needed = rows_to_decide(count / max(rows, 1), 0.0, allowed, confidence, paired=False) \
        if verdict == UNDECIDED else None
    return Decision(verdict, count / max(rows, 1), low, high, allowed, confidence, rows, needed)
