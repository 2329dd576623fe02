"""The task-level verdict of one artifact: its accuracy drop and its flipped decisions, decided with
confidence (`pipeline.gate.confidence`), or its MAE increase (regression).

Classification (integer class outputs, argmax of a float [N, C] score output, or a one-column sigmoid/logit
output at its threshold, `task_metric.TaskMetric.threshold`):

* a row whose decision differs from the SavedModel's is a *flip*; a flip is a *tie* when the SavedModel's
  margin (between the two classes' scores, or between its score and the binary threshold) is at most twice
  the artifact's measured error (the 99th percentile of |artifact - SavedModel| on the score output);
* the **accuracy drop** is judged from the discordant rows (ties counted as agreeing): rows only the
  SavedModel gets right against rows only the artifact gets right (`confidence.decide_drop`), allowed
  `validate.<family>.max_accuracy_drop_points` (0.5 float32 and float16, 1 dynamic_range and int8);
* the **flips**, ties included, are judged as a share of rows (`confidence.decide_share`), allowed 100 %
  minus the mode's top-1 floor (`validate.<family>.min_top1_agreement`: 1 % float, 5 % dynamic range, 10 % int8),
  whatever the value tolerances (and `validate.max_tie_share`) are set to: ties excuse a flip from the
  accuracy drop, not from this count, since a file wrong by a lot makes every flip a "tie" of its own large
  error; a file that flips 38 % of the decisions is refused even with `validate.int8.atol = 1.0`;
* a binary output whose labels hold both classes (`TaskMetric.auc`) is judged by its **AUC drop** instead of
  the accuracy drop: AUC is the metric `core.tasks` gives a binary task, decided by DeLong's paired test
  (`auc_drop.decide_auc_drop`) against the same allowance in points of AUC; its flips are judged as above;
* either refused fails the artifact; undecided (too few rows) publishes or leaves it out as
  `validate.undecided` says, with the bounds and the rows that would decide.

Regression (`pipeline.gate.regression_judgement`): the paired changes of MAE and RMSE over the same rows, decided
with confidence against `validate.regression_max_error_increase` label std, and the 99th percentile of the per-row
|artifact - SavedModel| held to a share of the SavedModel's own MAE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.auc_drop import decide_auc_drop
from tfship.pipeline.gate.confidence import PASSED, REFUSED, UNDECIDED, Decision, decide_drop, decide_share
from tfship.pipeline.gate.regression_judgement import RegressionDecision, decide_regression
from tfship.pipeline.gate.task_metric import TaskMetric

__all__ = ["TIE_ERROR_QUANTILE", "TaskJudgement", "max_loss", "score_output", "tie_flips"]

TIE_ERROR_QUANTILE = 0.99
_SEVERITY = {PASSED: 0, UNDECIDED: 1, REFUSED: 2}


def max_loss(artifact: Artifact, task: TaskMetric, settings: ValidateSection) -> float:
    """The allowed loss: accuracy points (classification), AUC points (binary; the same settings) or MAE increase
    in label std (regression).
    """
    if task.kind == "regression":
        return settings.regression_max_error_increase
    return settings.family(artifact.mode).max_accuracy_drop_points


def score_output(task: TaskMetric, reference: dict[str, np.ndarray], scores: dict[str, str]) -> str | None:
    """The float [N, C] output whose argmax (or, one column, whose threshold) is the task's prediction
    (itself, or the index output's scores).
    """
    value = reference[task.prediction]
    if value.dtype.kind == "f" and value.ndim == 2:
        return task.prediction
    if value.dtype.kind == "f" and task.threshold is not None:
        return task.prediction
    return scores.get(task.prediction)


def tie_flips(task: TaskMetric, outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray],
              score_name: str | None) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Rows whose predicted class differs from the SavedModel's, which of them are ties, and the bound.

    A flip is a tie when the SavedModel's score margin between its class and the artifact's (binary: between
    its score and the threshold) is at most twice the artifact's measured error bound on `score_name` (the
    99th percentile of |artifact - SavedModel| over that output): both may move by that much.

    Returns:
        (flips [N] bool, ties [N] bool, error bound or None when there is no score output).
    """
    got, want = task.predicted_class(outputs), task.predicted_class(reference)
    flips = got != want
    ties = np.zeros_like(flips)
    if score_name is None or score_name not in outputs:
        return flips, ties, None
    scores = np.asarray(reference[score_name], dtype=np.float64)
    error = np.abs(np.asarray(outputs[score_name], dtype=np.float64) - scores)
    bound = float(np.quantile(error, TIE_ERROR_QUANTILE)) if error.size else 0.0
    rows = np.nonzero(flips)[0]
    if task.threshold is not None:
        ties[rows] = np.abs(scores.reshape(len(flips), -1)[rows, 0] - task.threshold) <= 2.0 * bound
    else:
        ties[rows] = scores[rows, want[rows]] - scores[rows, got[rows]] <= 2.0 * bound
    return flips, ties, bound


def _more_severe(kept: Decision | None, new: Decision) -> Decision:
    if kept is None:
        return new
    return new if (_SEVERITY[new.verdict], new.estimate) > (_SEVERITY[kept.verdict], kept.estimate) else kept


@dataclass
class TaskJudgement:
    """The worst task-metric figures over the batch sizes, and the decisions with confidence.

    drop: the accuracy drop decision; flips_decision: the share of non-tie flips against the mode's
    allowance (both None for regression); regression: the worst regression decision over the batch sizes (None
    for classification).
    """

    loss: float = -float("inf")
    metric: float = float("nan")
    tie_metric: float | None = None
    agreement: float | None = None
    flips: int | None = None
    ties: int | None = None
    bound: float | None = None
    drop: Decision | None = None
    flips_decision: Decision | None = None
    regression: RegressionDecision | None = None

    def score(self, task: TaskMetric, outputs, reference, score_name: str | None, reference_metric: float,
              allowed: tuple[float, float], confidence: float, settings: ValidateSection | None = None) -> None:
        """Fold one batch size's outputs in; `allowed`: (accuracy drop, flip share), shares of rows; `settings`:
        the regression rules' settings (None: the defaults).
        """
        metric = task.score(outputs)
        if task.kind != "classification":
            if task.loss_vs(reference_metric, metric) > self.loss:
                self.loss, self.metric = task.loss_vs(reference_metric, metric), metric
            settings = settings or ValidateSection()
            decision = decide_regression(reference[task.prediction], outputs[task.prediction], task.labels,
                                         task.label_std, settings.regression_max_error_increase,
                                         settings.regression_row_quantile, settings.regression_row_error_share,
                                         confidence, reference_metric)
            if self.regression is None or decision.severity() > self.regression.severity():
                self.regression = decision
            return
        flips, ties, bound = tie_flips(task, outputs, reference, score_name)
        rows = len(flips)
        if task.auc:  # binary: the ranking's AUC, its drop decided by DeLong's paired test (no tie excuse)
            adjusted = metric
            self.drop = _more_severe(self.drop, decide_auc_drop(task.scores_of(reference), task.scores_of(outputs),
                                                                task.labels, allowed[0], confidence))
        else:
            predicted = task.predicted_class(outputs).copy()
            predicted[ties] = task.predicted_class(reference)[ties]
            adjusted = task.score_classes(predicted)
            reference_right = task.predicted_class(reference) == task.labels
            artifact_right = predicted == task.labels
            self.drop = _more_severe(self.drop, decide_drop(int(np.sum(reference_right & ~artifact_right)),
                                                            int(np.sum(~reference_right & artifact_right)), rows,
                                                            allowed[0], confidence))
        self.flips_decision = _more_severe(self.flips_decision,
                                           decide_share(int(np.sum(flips)), rows, allowed[1], confidence))
        agreement = 100.0 * float(np.mean(~flips))
        self.agreement = agreement if self.agreement is None else min(self.agreement, agreement)
        if task.loss_vs(reference_metric, adjusted) > self.loss:
            self.loss, self.metric, self.tie_metric = task.loss_vs(reference_metric, adjusted), metric, adjusted
            self.flips, self.ties, self.bound = int(flips.sum()), int(ties.sum()), bound

    def reasons(self, task: TaskMetric, reference_metric: float, limit: float, undecided: str) -> list[str]:
        """Why the task judgement fails the artifact (empty: it does not); `undecided`: `validate.undecided`."""
        if task.kind != "classification":
            decision = self.regression
            if decision is None or decision.verdict == PASSED or (decision.verdict == UNDECIDED
                                                                  and undecided != "leave_out"):
                return []
            suffix = "" if decision.verdict == REFUSED else " (validate.undecided = 'leave_out')"
            return [text + suffix for text in decision.describe(task.prediction)]
        out = []
        for decision, what, unit in self._decisions(task):
            if decision is None or decision.verdict == PASSED:
                continue
            if decision.verdict == REFUSED or undecided == "leave_out":
                out.append(decision.describe(what, unit) + ("" if decision.verdict == REFUSED
                                                            else " (validate.undecided = 'leave_out')"))
        return out

    def _decisions(self, task: TaskMetric) -> tuple[tuple[Decision | None, str, str], ...]:
        floor = "validate.<family>.min_top1_agreement"
        drop = "AUC drop (DeLong)" if task.auc else "accuracy drop"
        return ((self.drop, f"{drop} on output '{task.prediction}'", "points"),
                (self.flips_decision, f"decisions flipped on output '{task.prediction}' ({floor})", "% of rows"))

    def undecided_notes(self, task: TaskMetric) -> str:
        """The undecided decisions, described (empty when every decision was taken)."""
        if self.regression is not None:
            decision = self.regression
            notes = [c.describe(task.prediction, decision.confidence, decision.rows)
                     for c in (decision.mae, decision.rmse) if c.verdict == UNDECIDED]
            if decision.row_verdict == UNDECIDED:
                notes.append(decision.describe_rows(task.prediction))
            return "; ".join(notes)
        return "; ".join(d.describe(what, unit) for d, what, unit in self._decisions(task)
                         if d is not None and d.verdict == UNDECIDED)
