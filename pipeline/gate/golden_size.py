"""How many held-out rows the gate's decisions need, and whether the user's golden set holds them.

The gate decides a loss from counts of rows (`pipeline.gate.confidence`). A file that loses nothing (no row
lost, no decision flipped) is *passed* only once the upper bound on its loss is within the allowance; with
zero of N rows that bound is the exact Clopper-Pearson one, 1 - (1 - c')^(1/N), so the fewest rows that can
pass a file are

    N = ceil(ln(1 - c') / ln(1 - allowed)),

c' = 1 - (1 - c)/2 for the accuracy drop (each end of its interval; `confidence.decide_drop`) and c' = c for a
share of flipped decisions (`confidence.decide_share`). At the defaults (c = 95 %):

| decision | allowed | rows |
|---|---|---|
| accuracy drop, float modes | 0.5 points | 736 |
| accuracy drop, dynamic range and int8 | 1 point | 368 |
| flipped decisions, float32 and float16 | 1 % of rows | 299 |
| flipped decisions, dynamic range | 5 % | 59 |
| flipped decisions, int8 | 10 % | 29 |

The **default golden-set size** is the largest of these for the modes judged: 736 rows, the size at which the
default allowed drop of a float file can be decided. On fewer rows the report says so and names the number:
decisions there may come out *undecided* (`validate.undecided` then publishes or leaves the file out). A
binary output judged by AUC (`auc_drop`) has no such number: its interval narrows with the rows on which the
two rankings disagree, not with the row count; nor do regression's paired MAE and RMSE bounds
(`regression_judgement`), which narrow with the spread of the per-row error changes.
"""

from __future__ import annotations

from typing import Any

from tfship.pipeline.config import ValidateSection
from tfship.pipeline.gate.confidence import rows_to_decide
from tfship.pipeline.gate.task_metric import TaskMetric

__all__ = ["golden_set"]


def _needs(modes: set[str], task: TaskMetric, settings: ValidateSection) -> dict[str, dict[str, Any]]:
    needs: dict[str, dict[str, Any]] = {}
    for mode in sorted(modes):
        if not task.auc:
            drop = settings.family(mode).max_accuracy_drop_points
            needs[f"accuracy drop ({mode})"] = {
                "allowed": drop / 100.0, "rows": rows_to_decide(0.0, 0.0, drop / 100.0, settings.confidence)}
        floor = settings.family(mode).min_top1_agreement
        share = (100.0 - floor) / 100.0
        needs[f"flipped decisions ({mode})"] = {
            "allowed": share, "rows": rows_to_decide(0.0, 0.0, share, settings.confidence, paired=False)}
    return needs


def golden_set(rows: int, modes: set[str], task: TaskMetric, settings: ValidateSection) -> dict[str, Any]:
    """The golden set's size against the rows the gate's count decisions need (module docstring).

    Args:
        rows: held-out rows judged; modes: the artifacts' modes (`float32`, `float16`, ...); task: the metric.

    Returns:
        {"rows", "needed" (the largest need, None: no count decision), "enough" (bool), "decisions"
        ({decision: {"allowed" (share of rows), "rows"}}), "note" (a sentence for report.md; "" when enough)}.
    """
    needs = _needs(modes, task, settings) if task.kind == "classification" else {}
    counted = {name: need for name, need in needs.items() if need["rows"] is not None}
    needed = max((need["rows"] for need in counted.values()), default=None)
    enough = needed is None or rows >= needed
    note = ""
    if not enough:
        which, need = max(counted.items(), key=lambda item: item[1]["rows"])
        note = (f"The golden set holds {rows} held-out rows; {needed} rows would decide every default allowance "
                f"at {100 * settings.confidence:g} % confidence (the largest need: {which}, allowed "
                f"{100 * need['allowed']:g} {'points' if 'drop' in which else '% of rows'}, with no row lost). On "
                f"these rows a file that loses nothing can still be undecided (validate.undecided = "
                f"'{settings.undecided}' then decides); hold out at least {needed} rows to decide "
                "(docs/pipeline.md, Parity tolerances).")
    if task.auc:
        note += (" " if note else "") + ("The AUC drop (DeLong) has no fixed row count: its interval narrows with "
                                         "the rows on which the two rankings disagree.")
    return {"rows": rows, "needed": needed, "enough": enough, "decisions": needs, "note": note}
