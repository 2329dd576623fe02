"""Run reports: `report.json` for machines, `report.md` with matplotlib plots for people, and the
rich summary table printed at the end of `tfship run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfship.core.formats import ToleranceFamily
from tfship.pipeline.conversion.registry import format_of
from tfship.pipeline.gate.parity_lines import judgement_lines
from tfship.pipeline.orchestration.outcomes import OutcomeStatus
from tfship.pipeline.orchestration.reasons import first_line, table_cell
from tfship.pipeline.orchestration.stages import RunFolder, StageRecord
from tfship.pipeline.orchestration.verdict_notes import regression_figures, verdict_notes


def _human_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _bar(run: RunFolder, names: list[str], values: list[float], label: str, filename: str, plt) -> str:
    figure, axis = plt.subplots(figsize=(7, 3))
    axis.barh(names, values, color="#4c72b0")
    axis.set_xlabel(label)
    finite = [v for v in values if v == v]
    if label.startswith("accuracy") and finite:
        axis.set_xlim(max(0.0, min(finite) - 5), 100.5)
    figure.tight_layout()
    figure.savefig(run.root / filename, dpi=100)
    plt.close(figure)
    return filename


def _error_histograms(run: RunFolder, rows: list[dict[str, Any]], edges: list, plt) -> list[str]:
    """One PNG per output: absolute-error counts per log10 bin, one line per artifact."""
    outputs = list(dict.fromkeys(o["output"] for r in rows for o in r["outputs"] if o.get("error_histogram")))
    labels = [f"<{e:.0e}" if e is not None else f">={edges[-2]:.0e}" for e in edges[1:]]
    files = []
    for output in outputs:
        figure, axis = plt.subplots(figsize=(7, 3))
        for row in rows[1:]:  # the SavedModel against itself is all zeros
            counts = next((o["error_histogram"] for o in row["outputs"] if o["output"] == output), None)
            if counts:
                axis.plot(range(len(counts)), counts, marker="o", label=row["artifact"])
        axis.set_xticks(range(len(labels)), labels, rotation=45, fontsize=7)
        axis.set_yscale("symlog")
        axis.set_ylim(bottom=0)
        axis.set_xlabel(f"|artifact - SavedModel| for output '{output}'")
        axis.set_ylabel("elements")
        axis.legend(fontsize=7)
        figure.tight_layout()
        name = f"errors_{''.join(c if c.isalnum() else '_' for c in output)}.png"
        figure.savefig(run.root / name, dpi=100)
        plt.close(figure)
        files.append(name)
    return files


def _plots(run: RunFolder, parity: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = parity["artifacts"]
    names = [r["artifact"] for r in rows]
    metric = parity.get("metric", "accuracy_%")
    figures = [
        _bar(run, names, [r["metric"] for r in rows],
             "accuracy (%)" if metric == "accuracy_%" else f"{metric} on '{parity.get('metric_output')}'",
             "accuracy.png" if metric == "accuracy_%" else "metric.png", plt),
        _bar(run, names, [r["size_bytes"] / 1024 for r in rows], "size (KiB)", "size.png", plt),
        _bar(run, names, [r["latency_ms_batch1"] for r in rows], "latency at batch 1 (ms)", "latency.png", plt),
    ]
    return figures + _error_histograms(run, rows, parity.get("error_bin_edges", []), plt)


def training_details(train: dict[str, Any] | None) -> list[str]:
    """Report lines for the task, step kind, frozen layers, sparse gradients and debug switches (train.json)."""
    if not train or "step_kind" not in train:
        return []
    lines = []
    if "task" in train:
        figures = ", ".join(f"{name} {value:.4g}" for name, value in train.get("test_metrics", {}).items())
        lines.append(f"  - task: `{train['task']}` on the test split: {figures} "
                     f"(inputs {', '.join(train.get('inputs', []))})")
    kind = train["step_kind"]
    metrics = ", ".join(f"{name} {value:.4g}" for name, value in kind.get("last", {}).items())
    lines.append(f"  - step kind: `{kind['kind']}`" + (f" (last step: {metrics})" if metrics else ""))
    frozen = train.get("frozen", {})
    if frozen.get("layers"):
        lines.append(f"  - frozen layers: {', '.join(frozen['layers'])} ({len(frozen['weights'])} weights; "
                     f"optimizer slots for them: {len(frozen['optimizer_slots_for_frozen_weights'])})")
    for path, kind_name in train.get("sparse_gradients", {}).items():
        ops = train.get("sparse_update_ops") or []
        applied = f"applied sparsely ({', '.join(ops)})" if ops else "applied densely by the optimizer"
        lines.append(f"  - sparse gradient: `{path}` trains with {kind_name} (rows touched only), {applied}")
    switches = [name for name, on in train.get("debug", {}).items() if on]
    if switches:
        lines.append(f"  - debug switches on: {', '.join(switches)}")
    return lines


def _outcome_text(outcome: dict[str, Any] | None) -> str:
    """One Markdown-safe line: `published`, or `left out at <stage>: <cause> (full text: reasons/x.txt)`."""
    if outcome is None:
        return "-"
    if outcome["status"] == OutcomeStatus.PUBLISHED:
        return OutcomeStatus.PUBLISHED.value
    more = f" (full text: [{outcome['reason_file']}]({outcome['reason_file']}))" if outcome.get("reason_file") else ""
    return table_cell(f"left out at {outcome['stage']}: {first_line(outcome['reason'])}") + more


def _flips_text(row: dict[str, Any]) -> str:
    if row.get("flips") is None or row.get("reference"):
        return "-"
    return f"{row['flips']} ({row.get('tie_flips') or 0} ties)"


def _size_ratio(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """`row`'s size as a share of the float32 artifact of its own format package (`tflite_int8` against
    `tflite_float32`, `tfjs_uint8` against `tfjs`), e.g. `26.3% of tflite_float32`; "-" for that artifact itself,
    the SavedModel, or when its package's float32 artifact was not judged.
    """
    spec = format_of(row["artifact"])
    if spec is None or spec.family is ToleranceFamily.FLOAT32:
        return "-"
    baseline = next((r for r in rows if (other := format_of(r["artifact"])) is not None
                     and other.package == spec.package and other.family is ToleranceFamily.FLOAT32), None)
    if baseline is None or not baseline["size_bytes"]:
        return "-"
    return f"{100 * row['size_bytes'] / baseline['size_bytes']:.1f}% of {baseline['artifact']}"


def _artifact_lines(summary: dict[str, Any], parity: dict[str, Any]) -> list[str]:
    rows, metric = parity["artifacts"], parity.get("metric", "accuracy_%")
    outcomes = {o["artifact"]: o for o in summary.get("artifacts", [])}
    regression = metric == "mae"
    lines = ["", f"| artifact | mode | size | size vs its format's float32 | {'MAE | RMSE' if regression else metric} "
             "| agreement % | flips (ties) | latency b1 ms | worst float output (max abs err) | integer/string outputs "
             "| verdict | outcome |", "|---" * (13 if regression else 12) + "|"]
    for row in rows:
        worst = max((o for o in row["outputs"] if not o.get("exact")), key=lambda o: o["max_abs_error"], default=None)
        worst_text = f"{worst['output']} ({worst['max_abs_error']:.2e})" if worst else "-"
        exact_text = "; ".join(f"{o['output']}: {o['detail'] or 'equal'}" for o in row["outputs"] if o.get("exact"))
        ratio = _size_ratio(row, rows)
        agreement = "-" if row["top1_agreement"] is None else f"{row['top1_agreement']:.2f}"
        figures = " | ".join(regression_figures(row)) if regression else f"{row['metric']:.4g}"
        lines.append(f"| {row['artifact']} | {row['mode']} | {_human_bytes(row['size_bytes'])} | {ratio} "
                     f"| {figures} | {agreement} | {_flips_text(row)} | {row['latency_ms_batch1']:.3f} "
                     f"| {table_cell(worst_text)} | {table_cell(exact_text)} "
                     f"| {verdict_text(row)} | {_outcome_text(outcomes.get(row['artifact']))} |")
    return lines + [line for note in verdict_notes(parity) for line in ("", "- " + note)]


def verdict_text(row: dict[str, Any], short: bool = False) -> str:
    """'reference' for the SavedModel itself (what the others are judged against: nothing to decide); 'pass';
    'pass (undecided ...)' when a decision could not be taken on these rows and `validate.undecided = publish` let
    the file through (the report's "Parity judgement" section gives the bounds); or 'FAIL: ...'.
    `short`: the terminal table's form (no table escaping, the undecided note cut to its word).
    """
    if not row["passed"]:
        return "FAIL (reason below)" if short else table_cell("FAIL: " + first_line(row["reason"]))
    if row.get("reference") or (row.get("artifact") == "saved_model" and "reference" not in row):
        return "reference"
    if not row.get("undecided"):
        return "pass"
    return "pass (undecided)" if short else "pass (undecided: too few rows; validate.undecided = publish)"


def memory_lines(memory: dict[str, Any] | None) -> list[str]:
    """The convert stage's memory budget and each conversion's predicted and measured peak, as report lines."""
    if not memory or not memory.get("rows"):
        return []
    budget = _human_bytes(memory["budget_bytes"]) if memory["budget_bytes"] else "none"
    peaks = ", ".join(f"{r['name']} {_human_bytes(r['measured_bytes'])} (predicted {_human_bytes(r['predicted_bytes'])}"
                      f"{', waited for memory' if r['waited_for_memory'] else ''})" for r in memory["rows"])
    return ["", f"- convert memory budget: {budget} ({memory['budget_source']}); this process "
            f"{_human_bytes(memory['parent_rss_bytes'])}, up to {memory['workers']} conversions at once; "
            f"peak per conversion: {peaks}"]


def write_report(run: RunFolder, summary: dict[str, Any]) -> tuple[Path, Path]:
    """Write `report.json` and `report.md` (+ PNG plots: metric, size, latency, error histogram per output)
    into the run folder; return both paths. A failed run's summary (status `failed`, `error`, no parity
    yet) gives a report of what ran and why it stopped.
    """
    parity = summary.get("parity")
    json_path = run.write_json("report.json", summary)
    train = summary.get("train")
    train_line = (f"- train: {train['epochs']} epochs, {train['steps']} steps, {train['train_step_traces']} "
                  f"trace(s) of the train step, XLA {'on' if train['jit_compile'] else 'off'}, {train['seconds']} s"
                  if train else f"- export-only: model `{summary.get('export_only', {}).get('model')}`, data "
                  f"`{summary.get('export_only', {}).get('data')}` (training skipped)"
                  if summary.get("export_only") else "- train: -")
    lines = ["# tfship run report", "", f"- {summary.get('status_line', '')}", f"- run: `{summary['run']}`",
             f"- published: `{summary['published']}`",
             f"- audit: {'passed' if summary['audit_passed'] else 'FAILED or not run'}", train_line,
             *training_details(train)]
    if summary.get("error"):
        lines.append(f"- error: {first_line(summary['error'], 2000)}")
    if summary.get("stages"):
        lines += ["", "| stage | status | seconds | note |", "|---|---|---|---|"]
        lines += [f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {table_cell(first_line(s['reason']))} |"
                  for s in summary["stages"]]
    if summary.get("artifacts"):
        lines += ["", "| artifact | outcome | file | required |", "|---|---|---|---|"]
        lines += [f"| {table_cell(o['artifact'])} | {_outcome_text(o)} | {table_cell(o['file'])} "
                  f"| {'yes' if o['required'] else 'no'} |"
                  for o in summary["artifacts"]]
    if summary.get("signatures"):
        lines += ["", "| signature | carried by | serve-check | files | not carried by |", "|---|---|---|---|---|"]
        lines += [f"| {table_cell(name)} | {', '.join(row['artifacts']) or '-'} | {table_cell(row['serve_check'])} "
                  f"| {table_cell(', '.join(sorted(set(row.get('files', {}).values()))))} "
                  f"| {table_cell('; '.join(f'{a}: {why}' for a, why in row.get('left_out', {}).items()))} |"
                  for name, row in summary["signatures"].items()]
    if parity:
        metric = parity.get("metric", "accuracy_%")
        lines += ["", f"- task metric: {metric} on output `{parity.get('metric_output')}` against "
                  f"{parity.get('label_source', 'labels')}; SavedModel: "
                  f"{parity.get('reference_metric', float('nan')):.4g}; {parity.get('samples')} rows"]
        lines += _artifact_lines(summary, parity)
        lines += judgement_lines(parity)
    lines += ["", "| conversion | status | recipe | reason |", "|---|---|---|---|"]
    lines += [f"| {table_cell(c['name'])} | {c['status']} | {table_cell(c.get('recipe') or '-')} "
              f"| {table_cell(first_line(c['reason']))} |"
              for c in summary.get("conversions") or []]
    lines += memory_lines(summary.get("convert_memory"))
    if parity:
        lines += [""] + [f"![{name}]({name})" for name in _plots(run, parity)]
    md_path = run.root / "report.md"
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return json_path, md_path


def summary_tables(summary: dict[str, Any], records: list[StageRecord]):
    """Rich tables for the terminal: stages, and artifacts (metric, parity, size, outcome). Notes are whole,
    never cut: rich wraps them (`summary_notes` gives the lines printed under the artifacts table).
    """
    from rich.table import Table

    stages = Table(title="stages")
    for column in ("stage", "status", "seconds", "note"):
        stages.add_column(column, overflow="fold")  # a narrow terminal wraps a cell, never cuts it with "…"
    for record in records:
        stages.add_row(record.name, record.status.value, f"{record.seconds:.1f}", first_line(record.reason, None))
    parity = summary["parity"]
    regression = parity.get("metric") == "mae"
    artifacts = Table(title="artifacts (held-out test split, compared by output name with the SavedModel)")
    for column in ("artifact", "mode", "size", *(("MAE", "RMSE") if regression else (parity.get("metric",
                   "accuracy_%"),)), "agree %", "flips (ties)", "worst float output", "max abs err", "other outputs",
                   "verdict", "outcome"):
        artifacts.add_column(column, overflow="fold")
    outcomes = {o["artifact"]: o for o in summary.get("artifacts", [])}
    for row in parity["artifacts"]:
        floats = [o for o in row["outputs"] if not o.get("exact")]
        worst = max(floats, key=lambda o: (not o["passed"], o["max_abs_error"]), default={})
        exact = [f"{o['output']}: {o['detail'] or 'equal'}" for o in row["outputs"] if o.get("exact")]
        outcome = outcomes.get(row["artifact"])
        figures = regression_figures(row) if regression else (f"{row['metric']:.4g}",)
        artifacts.add_row(row["artifact"], row["mode"], _human_bytes(row["size_bytes"]), *figures,
                          "-" if row["top1_agreement"] is None else f"{row['top1_agreement']:.2f}", _flips_text(row),
                          worst.get("output", "-"), f"{worst.get('max_abs_error', float('nan')):.2e}",
                          "; ".join(exact) or "-", verdict_text(row, short=True),
                          "-" if outcome is None else ("published" if outcome["status"] == OutcomeStatus.PUBLISHED
                                                       else f"left out ({outcome['stage']})"))
    for name, outcome in outcomes.items():  # left out before the parity gate: no parity row
        if name not in {row["artifact"] for row in parity["artifacts"]}:
            artifacts.add_row(name, "-", "-", *(("-", "-") if regression else ("-",)), "-", "-", "-", "-", "-", "-",
                              f"left out ({outcome['stage']}), reason below")
    return stages, artifacts


def summary_notes(summary: dict[str, Any]) -> list[str]:
    """The lines printed under the terminal's artifacts table: each left-out artifact's whole reason (never cut),
    then what undecided means and what would decide it, what a tie is, how regression was judged
    (`verdict_notes`).
    """
    lines = [f"{o['artifact']} left out at {o['stage']}: {first_line(o.get('reason', ''), None)}"
             + (f" (full text: {o['reason_file']})" if o.get("reason_file") else "")
             for o in summary.get("artifacts", []) if o["status"] != OutcomeStatus.PUBLISHED]
    if not summary.get("artifacts"):  # the validate stage alone: its failures, no outcomes yet
        lines = [f"{row['artifact']} fails the parity gate: {first_line(row['reason'], None)}"
                 for row in (summary.get("parity") or {}).get("artifacts", []) if not row["passed"]]
    return lines + verdict_notes(summary.get("parity") or {})
