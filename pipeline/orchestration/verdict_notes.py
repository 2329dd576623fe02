"""The lines under the artifacts table that say what its verdicts mean: why a file is `pass (undecided)` and what
would decide it, what a tie is, how a regression file was judged, and which dynamic-range file quantised nothing,
in plain words with the run's own figures.

`tfship run` prints them under the terminal table and `report.md` carries them under its artifact table. Each
reads `parity.json`'s dict form (`ParityReport.to_json`); nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import Any

__all__ = ["regression_figures", "regression_line", "ties_legend", "undecided_line", "unquantised_lines",
           "verdict_notes"]

_MORE_ROWS = "hold out more rows: data.test_fraction, or data.sample_size for a streaming source"


def _rows_to_decide(row: dict[str, Any]) -> int | None:
    needs = [d.get("rows_to_decide") for key in ("accuracy_decision", "flips_decision", "auc_decision")
             if (d := row.get(key)) and d.get("verdict") == "undecided"]
    regression = row.get("regression_decision") or {}
    needs += [regression[k].get("rows_to_decide") for k in ("mae", "rmse")
              if regression.get(k, {}).get("verdict") == "undecided"]
    if regression.get("row_verdict") == "undecided":
        needs.append(regression.get("row_rows_to_decide"))
    return max((n for n in needs if n), default=None)


def undecided_line(parity: dict[str, Any]) -> str:
    """One line: which files are `pass (undecided)`, what undecided means and how many rows would decide ("" when
    none is), e.g. `undecided (onnx, tflite_float32): 360 held-out rows cannot tell a 0.5-point accuracy drop
    from noise at 95 % confidence; 736 would decide (...); published because validate.undecided = publish`.
    """
    rows = [row for row in parity.get("artifacts", []) if row.get("passed") and row.get("undecided")]
    if not rows:
        return ""
    samples, golden = parity.get("samples"), parity.get("golden_set") or {}
    names = ", ".join(row["artifact"] for row in rows)
    confidence = next((d["confidence"] for row in rows for key in ("accuracy_decision", "flips_decision",
                                                                   "auc_decision", "regression_decision")
                       if (d := row.get(key)) and "confidence" in d), 0.95)
    decisions = {name: need for name, need in (golden.get("decisions") or {}).items() if need.get("rows")}
    if not golden.get("enough", True) and decisions:
        which, need = max(decisions.items(), key=lambda item: item[1]["rows"])
        unit = "point" if "drop" in which else "% of rows"
        what = "accuracy drop" if "drop" in which else "share of flipped decisions"
        cause = (f"{samples} held-out rows cannot tell a {100 * need['allowed']:g}-{unit} {what} "
                 f"({which.split('(')[-1].rstrip(')')} files) from noise at {100 * confidence:g} % confidence; "
                 f"{golden['needed']} would decide")
    elif (per_row := _per_row_cause(rows, samples, confidence)) is not None:
        cause = per_row
    else:
        needed = max((n for row in rows if (n := _rows_to_decide(row))), default=None)
        cause = (f"on {samples} held-out rows the loss these files show is neither clearly within nor clearly "
                 f"beyond its allowance at {100 * confidence:g} % confidence"
                 + (f"; about {needed} rows would decide" if needed else ""))
    return (f"undecided ({names}): {cause} ({_MORE_ROWS}); published because validate.undecided = publish "
            "(leave_out would leave them out); bounds in report.md, Parity judgement")


def _per_row_cause(rows: list[dict[str, Any]], samples: Any, confidence: float) -> str | None:
    """The undecided cause when only regression's per-row rule is undecided (the paired MAE and RMSE changes
    passed), in its own terms: the rows over the bound and the share they cannot rule out; None otherwise.
    """
    decisions = [row.get("regression_decision") or {} for row in rows]
    if not decisions or not all(d.get("row_verdict") == "undecided" and d.get("mae", {}).get("verdict") == "passed"
                                and d.get("rmse", {}).get("verdict") == "passed" for d in decisions):
        return None
    first = max(decisions, key=lambda d: d.get("rows_over_bound", 0))
    needed = max((n for d in decisions if (n := d.get("row_rows_to_decide"))), default=None)
    share = f"{100 * (1 - first['quantile']):.3g}"
    return (f"their MAE and RMSE changes are within the allowance, but on {samples} held-out rows "
            f"({first.get('rows_over_bound', 0)} over the per-row bound {first['row_bound']:.3g}) "
            f"{100 * confidence:g} % confidence cannot show that at most {share} % of rows move a prediction "
            f"further" + (f"; about {needed} rows would decide" if needed else ""))


def ties_legend(parity: dict[str, Any]) -> str:
    """What `flips (ties)` counts ("" when no row has flips, e.g. regression)."""
    if not any(row.get("flips") is not None for row in parity.get("artifacts", [])):
        return ""
    return ("flips (ties): held-out rows whose predicted class differs from the SavedModel's; a tie is a flip on a "
            "row where the SavedModel's own margin between the two classes is within twice the file's error (its "
            "99th percentile of |file - SavedModel|), so either answer is right within rounding: ties are not "
            "counted as lost rows, but every flip counts against validate.<mode>.min_top1_agreement")


def regression_figures(row: dict[str, Any]) -> tuple[str, str]:
    """(MAE, RMSE) of a regression row as text ("-" when the row has no regression judgement)."""
    decision = row.get("regression_decision")
    if not decision:
        return "-", "-"
    return f"{decision['mae']['candidate']:.4g}", f"{decision['rmse']['candidate']:.4g}"


def regression_line(parity: dict[str, Any]) -> str:
    """How a regression run's files were judged, with its figures ("" for other tasks)."""
    judged = [row["regression_decision"] for row in parity.get("artifacts", [])
              if row.get("regression_decision") and not row.get("reference")]
    reference = next((row["regression_decision"] for row in parity.get("artifacts", [])
                      if row.get("regression_decision") and row.get("reference")), None)
    if not judged and reference is None:
        return ""
    first = (judged or [reference])[0]
    percent = f"{100 * first['quantile']:g}"
    own = (f"SavedModel MAE {reference['mae']['reference']:.4g}, RMSE {reference['rmse']['reference']:.4g} on "
           f"{reference['rows']} rows; " if reference else "")
    return (f"regression: {own}each file's MAE and RMSE change over the same rows is decided with "
            f"{100 * first['confidence']:g} % paired bounds against +{first['mae']['allowed']:.3g} (validate."
            f"regression_max_error_increase x the labels' std {first['label_std']:.4g}), and on {percent} rows of "
            f"100 a file may move a prediction by at most {first['row_bound']:.3g} ({first['row_bound_basis']})")


def _same_outputs(row: dict[str, Any], other: dict[str, Any]) -> bool:
    errors = {o["output"]: o["max_abs_error"] for o in other["outputs"]}
    return bool(row["outputs"]) and all(o["output"] in errors and abs(o["max_abs_error"] - errors[o["output"]])
                                        <= 1e-9 + 1e-6 * abs(errors[o["output"]]) for o in row["outputs"])


def unquantised_lines(parity: dict[str, Any]) -> list[str]:
    """One line per dynamic-range file that quantised nothing: the size of its format's float32 file (within 5 %)
    and the same error on every output, so it is that float32 file in effect.
    """
    from tfship.core.formats import ToleranceFamily
    from tfship.pipeline.conversion.registry import format_of

    rows, lines = parity.get("artifacts", []), []
    for row in rows:
        spec = format_of(row["artifact"])
        if spec is None or row["mode"] != ToleranceFamily.DYNAMIC_RANGE or not row["size_bytes"]:
            continue
        base = next((r for r in rows if r["mode"] == ToleranceFamily.FLOAT32
                     and (o := format_of(r["artifact"])) is not None and o.package == spec.package), None)
        if base and base["size_bytes"] and row["size_bytes"] >= 0.95 * base["size_bytes"] and _same_outputs(row, base):
            lines.append(f"{row['artifact']} is identical to {base['artifact']} in effect ({row['size_bytes']} bytes "
                         f"against {base['size_bytes']}, the same error on every output): dynamic-range quantisation "
                         "changed no weight (the converter leaves weight tensors under 1,024 elements in float32), "
                         f"so it saves nothing; leave it out of convert.tflite_modes, or use int8 to shrink the model")
    return lines


def verdict_notes(parity: dict[str, Any]) -> list[str]:
    """The notes that apply to this run, in order: undecided, ties, regression, dynamic-range files that quantised
    nothing.
    """
    lines = [line for line in (undecided_line(parity), ties_legend(parity), regression_line(parity)) if line]
    return lines + unquantised_lines(parity)
