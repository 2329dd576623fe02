"""The parity judgement as Markdown lines for `report.md`: for every float output the noises the float32
bound is built from (measured how, how large), each artifact's error against the SavedModel and against
float64, the bound it was held to; and every decision taken from counts of rows (accuracy drop, flipped
decisions; regression's paired MAE and RMSE changes and per-row error) with its bounds, verdict and the rows
that would decide. Reads `parity.json`'s dict form
(`ParityReport.to_json`); nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import Any

__all__ = ["judgement_lines"]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _noise_lines(parity: dict[str, Any]) -> list[str]:
    batch, implementation = parity.get("reference_noise", {}), parity.get("implementation_noise", {})
    if not batch and not implementation:
        return []
    lines = ["", "Float outputs: the SavedModel's own noise, allowed on top of every float bound "
             "(docs/pipeline.md, Parity tolerances).", "",
             "| output | batch noise (between batch sizes) | implementation noise (float32 rounding) | measured by |",
             "|---|---|---|---|"]
    for name in sorted(set(batch) | set(implementation)):
        b, i = batch.get(name, {}), implementation.get(name, {})
        pair = b.get("batch_sizes") or ("-", "-")
        lines.append(f"| {_cell(name)} | {b.get('max_abs', 0.0):.2g} (batch {pair[0]} vs {pair[1]}) | "
                     f"{i.get('max_abs', 0.0):.2g} | {_cell(i.get('method', '-') or '-')} |")
    return lines


def _error_lines(parity: dict[str, Any]) -> list[str]:
    lines = ["", "| artifact | output | max error vs SavedModel | max error vs float64 | bound | verdict |",
             "|---|---|---|---|---|---|"]
    for row in parity.get("artifacts", []):
        truth = row.get("float64_errors") or {}
        for output in row.get("outputs", []):
            if output.get("exact"):
                continue
            vs64 = truth.get(output["output"])
            lines.append(f"| {_cell(row['artifact'])} | {_cell(output['output'])} | {output['max_abs_error']:.3g} | "
                         f"{'-' if vs64 is None else f'{vs64:.3g}'} | {_cell(output['tolerance'])} | "
                         f"{'pass' if output['passed'] else 'FAIL'} |")
    return lines if len(lines) > 3 else []


def _decision_cell(decision: dict[str, Any] | None, unit: str) -> str:
    if not decision:
        return "-"
    text = (f"{decision['verdict']}: {100 * decision['estimate']:.2f} {unit} "
            f"[{100 * decision['low']:.2f}, {100 * decision['high']:.2f}] vs {100 * decision['allowed']:g}")
    return text + (f"; ~{decision['rows_to_decide']} rows would decide" if decision.get("rows_to_decide") else "")


def _decision_lines(parity: dict[str, Any]) -> list[str]:
    rows = [row for row in parity.get("artifacts", []) if row.get("accuracy_decision") or row.get("flips_decision")]
    if not rows:
        return []
    confidence = next(r[k]["confidence"] for r in rows for k in ("accuracy_decision", "flips_decision") if r.get(k))
    auc = parity.get("metric") == "auc"
    drop = "AUC drop (points of AUC; DeLong's paired test)" if auc else "accuracy drop (points)"
    lines = ["", f"Decisions from {parity.get('samples')} rows at {100 * confidence:g} % confidence (exact binomial "
             f"bounds{', DeLong for the AUC drop' if auc else ''}; undecided: too few rows, `validate.undecided` "
             "decides).", "", f"| artifact | {drop} | flipped decisions (% of rows) |", "|---|---|---|"]
    lines += [f"| {_cell(row['artifact'])} | "
              f"{_cell(_decision_cell(row.get('auc_decision') or row.get('accuracy_decision'), 'points'))} | "
              f"{_cell(_decision_cell(row.get('flips_decision'), '%'))} |" for row in rows]
    note = (parity.get("golden_set") or {}).get("note")
    return lines + (["", note] if note else [])


def _change_cell(change: dict[str, Any]) -> str:
    text = (f"{change['verdict']}: {change['reference']:.4g} -> {change['candidate']:.4g}, {change['estimate']:+.3g} "
            f"[{change['low']:+.3g}, {change['high']:+.3g}] vs +{change['allowed']:.3g}")
    return text + (f"; ~{change['rows_to_decide']} rows would decide" if change.get("rows_to_decide") else "")


def _regression_lines(parity: dict[str, Any]) -> list[str]:
    rows = [row for row in parity.get("artifacts", []) if row.get("regression_decision") and not row.get("reference")]
    if not rows:
        return []
    first = rows[0]["regression_decision"]
    lines = ["", f"Regression decisions from {first['rows']} rows at {100 * first['confidence']:g} % confidence "
             "(paired over the same rows, Student's t; label units): the MAE and RMSE change against the allowance, "
             f"and the share of rows whose |artifact - SavedModel| exceeds its bound against "
             f"{100 * (1 - first['quantile']):.3g} % (exact binomial test: the {100 * first['quantile']:g}th "
             "percentile within the bound).", "",
             "| artifact | MAE change | RMSE change | per-row error (bound) |", "|---|---|---|---|"]
    for row in rows:
        decision = row["regression_decision"]
        row_verdict = decision.get("row_verdict") or ("refused" if decision["row_error"] > decision["row_bound"]
                                                       else "passed")
        rows_cell = (f"{row_verdict}: {decision['row_error']:.3g} ({decision['row_bound']:.3g}, "
                     f"{decision['row_bound_basis']}); {decision.get('rows_over_bound', '?')} of {decision['rows']} "
                     "rows over it")
        lines.append(f"| {_cell(row['artifact'])} | {_cell(_change_cell(decision['mae']))} | "
                     f"{_cell(_change_cell(decision['rmse']))} | {_cell(rows_cell)} |")
    return lines


def judgement_lines(parity: dict[str, Any]) -> list[str]:
    """Markdown lines (a heading, then tables) explaining the parity verdicts of `parity` (parity.json)."""
    body = _noise_lines(parity) + _error_lines(parity) + _decision_lines(parity) + _regression_lines(parity)
    return (["", "### Parity judgement"] + body) if body else []
