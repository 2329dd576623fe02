"""Behavioural proof that a reloaded SavedModel serves an inference function.

Three checks on the `serving_default` signature of the SavedModel as TensorFlow Serving would load it
(`tf.saved_model.load`), on real rows of the user's data:

* determinism: the same batch of 8 twice gives the same outputs, within float rounding
  (`export.batch_independence_tolerance` of the output's range; integer and string outputs exactly): active
  dropout, noise or augmentation gives different answers;
* batch independence: row i run alone (batch 1) equals row i inside the batch of 8 within
  `export.batch_independence_tolerance` (`pipeline.gate.compare.compare_outputs`: that fraction of the
  output's range plus of each value, and twice the float rounding the model itself shows between the batch
  of 8 and the same 8 rows twice in a batch of 16 — same statistics, other kernel paths; integer and
  string outputs exactly, index outputs by the values they select). Batch normalisation in training mode
  normalises with the batch's own statistics and fails this by far more than rounding does;
* no state (`stateless`): no variable changes value across serving calls (moving-average updates, seed states),
  and the signature reaches no op with a side effect on the host: a SavedModel the op policy refuses
  (`core.op_policy`: files, Python, the process) is never run; its report (`refused_behaviour`) fails `stateless`
  naming those ops, and the other checks are marked not run.

A failure raises `AuditError` naming the check, the output, the row and the size of the difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.errors import AuditError, tensorflow_failure
from tfship.pipeline.gate.compare import Tolerance, compare_outputs

BATCH = 8


@dataclass(frozen=True)
class BehaviourCheck:
    """One check's verdict and, when it failed, what differed."""

    name: str
    passed: bool
    detail: str = ""
    ran: bool = True  # False: not run (the op policy refused the graph, so nothing executed it)


@dataclass(frozen=True)
class BehaviourReport:
    """All behavioural checks of one SavedModel signature."""

    saved_model_dir: str
    signature: str
    checks: tuple[BehaviourCheck, ...]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        """JSON form for `audit.json` and the manifest."""
        return {"passed": self.passed, "signature": self.signature, "checks": [asdict(c) for c in self.checks]}


def _rows(inputs: Mapping[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    total = len(next(iter(inputs.values())))
    if total == 0:
        raise AuditError("behaviour checks need at least one input row; the data set is empty")
    pick = np.arange(count) % total
    return {name: np.asarray(value)[pick] for name, value in inputs.items()}


def _outputs_differ(first: dict[str, np.ndarray], second: dict[str, np.ndarray], tolerance: float) -> list[str]:
    """Outputs that differ between two identical calls beyond float rounding (`tolerance` of the output's range
    and of each value; integer and string outputs exactly).
    """
    differ = []
    for name in first:
        a, b = np.asarray(first[name]), np.asarray(second[name])
        if a.dtype.kind in "fc":
            bound = Tolerance(tolerance, tolerance).bound(np.nan_to_num(a.astype(np.float64)))
            gap = np.abs(np.nan_to_num(a.astype(np.float64)) - np.nan_to_num(b.astype(np.float64)))
            same = np.array_equal(np.isnan(a), np.isnan(b)) and bool(np.all(gap <= bound))
        else:
            same = np.array_equal(a, b)
        if not same:
            most = float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.dtype.kind in "fiub" \
                else float("nan")
            differ.append(f"output '{name}' differs between two identical calls (max difference {most:.3g}, beyond "
                          f"float rounding: export.batch_independence_tolerance {tolerance:g})")
    return differ


def _variable_values(function) -> dict[str, np.ndarray]:
    return {f"{variable.name}#{index}": variable.numpy().copy() for index, variable in enumerate(function.variables)}


def _rounding(batch: dict[str, np.ndarray], first: dict[str, np.ndarray], call) -> dict[str, float]:
    """{float output: largest |batch of 8 - the same rows in a batch of 16|}: the model's own rounding."""
    try:
        doubled = call({name: np.concatenate([value, value]) for name, value in batch.items()})
    except Exception:  # noqa: BLE001 - a signature that cannot take 16 rows shows no rounding to allow for
        return {}
    noise = {}
    for name, value in first.items():
        value = np.asarray(value)
        if value.dtype.kind == "f" and np.asarray(doubled[name]).shape[0] == 2 * BATCH and np.all(np.isfinite(value)):
            twice = np.asarray(doubled[name], dtype=np.float64)
            noise[name] = float(max(np.max(np.abs(twice[:BATCH] - value)), np.max(np.abs(twice[BATCH:] - value))))
    return noise


def refused_behaviour(saved_model_dir: Path, signature: str, policy) -> BehaviourReport:
    """The behaviour report of a SavedModel the op policy refused, made without running it: `stateless` fails
    naming the side effects `signature` reaches (or, when it reaches none, the refused ops elsewhere in the file:
    loading runs init and restore functions); `deterministic` and `batch_independent` fail as not run.

    Args:
        policy: the `core.op_policy.PolicyReport` (not passed).
    """
    effects = [f.describe() for f in policy.side_effects(signature)] or policy.violations
    not_run = "not run: the op policy refused this SavedModel, so nothing executes it"
    detail = f"side effects on the host: {'; '.join(effects[:4])}" + (f" (+{len(effects) - 4} more)"
                                                                        if len(effects) > 4 else "")
    return BehaviourReport(str(saved_model_dir), signature, (
        BehaviourCheck("deterministic", False, not_run, ran=False),
        BehaviourCheck("batch_independent", False, not_run, ran=False),
        BehaviourCheck("stateless", False, detail, ran=False)))


def check_behaviour(saved_model_dir: Path, inputs: Mapping[str, np.ndarray], signature: str = "serving_default",
                    tolerance: float = 1e-3, side_effects: list[str] | tuple[str, ...] = ()) -> BehaviourReport:
    """Run the three behavioural checks (module docstring) on a reloaded SavedModel.

    Args:
        saved_model_dir: the exported SavedModel.
        inputs: {signature input name: [N, ...]} real rows (N >= 1; rows are cycled to fill a batch of 8).
        tolerance: `export.batch_independence_tolerance`: atol (scaled by max(1, max |output|)) and rtol of the
            batch-independence check, on top of twice the model's own rounding between batches of 8 and 16.
        side_effects: the host ops `signature` reaches that the operator allowed (`export.allow_ops`); they are
            named in `stateless`'s detail and do not fail it (refused ones never get here: `refused_behaviour`).

    Returns:
        The report; call `raise_if_failed` to gate on it.

    Raises:
        AuditError: the signature does not run in this TensorFlow on these rows (any `tf.errors.OpError`, e.g.
            an op this build has no kernel for), naming the error, its cause and the node.
    """
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model_dir))
    function = loaded.signatures[signature]
    batch = _rows(inputs, BATCH)

    def call(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return {k: v.numpy() for k, v in function(**{n: tf.constant(a) for n, a in feed.items()}).items()}
        except tf.errors.OpError as err:  # the graph cannot run here: a server on this host would fail the same way
            raise AuditError(f"{saved_model_dir}: signature '{signature}' does not run in this TensorFlow on the "
                             f"held-out rows (batch of {len(next(iter(feed.values())))}): {type(err).__name__}: "
                             f"{tensorflow_failure(err.message)}") from err

    before = _variable_values(function)
    first, second = call(batch), call(batch)
    differ = _outputs_differ(first, second, tolerance)
    checks = [BehaviourCheck("deterministic", not differ, "; ".join(differ))]
    problems = []
    alone = [call({name: value[row:row + 1] for name, value in batch.items()}) for row in range(BATCH)]
    stacked = {name: np.concatenate([rows[name] for rows in alone]) for name in first}
    rounding = _rounding(batch, first, call)
    bound = Tolerance(tolerance, tolerance, setting="export.batch_independence_tolerance")
    for row in compare_outputs(stacked, first, bound, noise=rounding):
        if not row.passed:
            problems.append(f"output '{row.output}' rows run alone (batch 1) vs the same rows in a batch of {BATCH}: "
                            f"{row.describe()}; the same rows in a batch of {2 * BATCH} differ from the batch of "
                            f"{BATCH} by {rounding.get(row.output, 0.0):.2g} (float rounding). Outputs that depend "
                            "on the other rows of the batch (BatchNormalization or Dropout in training mode) are not "
                            f"an inference function; if this is rounding, raise export.batch_independence_tolerance "
                            f"(now {tolerance:g})")
    checks.append(BehaviourCheck("batch_independent", not problems, "; ".join(problems[:4])
                                 + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")))
    after = _variable_values(function)
    changed = [name.split("#")[0] for name in before if not np.array_equal(before[name], after[name])]
    allowed = f"side effects allowed by export.allow_ops: {'; '.join(side_effects[:4])}" if side_effects else ""
    checks.append(BehaviourCheck("stateless", not changed, "; ".join(filter(None, (
        f"variables changed value across serving calls: {changed[:8]}" if changed else "", allowed)))))
    return BehaviourReport(str(saved_model_dir), signature, tuple(checks))


def raise_if_failed(report: BehaviourReport) -> BehaviourReport:
    """Return the report when every check passed.

    Raises:
        AuditError: naming each failed check and what differed.
    """
    failed = [c for c in report.checks if not c.passed]
    if failed:
        raise AuditError(f"behaviour of {report.saved_model_dir} [{report.signature}] is not an inference "
                         "function: " + " | ".join(f"{c.name}: {c.detail}" for c in failed))
    return report
