"""Run reports: `report.json` for machines, `report.md` with matplotlib plots for people, and the
rich summary table printed at the end of `tfship run`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.stages import RunFolder, StageRecord


def _human_bytes(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _plots(run: RunFolder, rows: list[dict[str, Any]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["artifact"] for r in rows]
    figures = []
    for key, label, filename in (("accuracy", "test accuracy (%)", "accuracy.png"),
                                 ("size_bytes", "size (KiB)", "size.png"),
                                 ("latency_ms_batch1", "latency at batch 1 (ms)", "latency.png")):
        values = [r[key] / 1024 if key == "size_bytes" else r[key] for r in rows]
        figure, axis = plt.subplots(figsize=(7, 3))
        axis.barh(names, values, color="#4c72b0")
        axis.set_xlabel(label)
        if key == "accuracy":
            axis.set_xlim(max(0.0, min(values) - 5), 100.5)
        figure.tight_layout()
        figure.savefig(run.root / filename, dpi=100)
        plt.close(figure)
        figures.append(filename)
    return figures


def write_report(run: RunFolder, summary: dict[str, Any]) -> tuple[Path, Path]:
    """Write `report.json` and `report.md` (+ PNG plots) into the run folder; return both paths."""
    rows = summary["parity"]["artifacts"]
    json_path = run.write_json("report.json", summary)
    lines = [f"# tfship run report", "", f"- run: `{summary['run']}`", f"- published: `{summary['published']}`",
             f"- audit: {'passed' if summary['audit_passed'] else 'FAILED'}",
             f"- train: {summary['train']['epochs']} epochs, {summary['train']['steps']} steps, "
             f"{summary['train']['train_step_traces']} trace(s) of the train step, "
             f"XLA {'on' if summary['train']['jit_compile'] else 'off'}, {summary['train']['seconds']} s", "",
             "| artifact | mode | size | accuracy % | top-1 agreement % | latency b1 ms | worst output (max abs err) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        worst = max(row["outputs"], key=lambda o: o["max_abs_error"], default=None)
        worst_text = f"{worst['output']} ({worst['max_abs_error']:.2e})" if worst else "-"
        lines.append(f"| {row['artifact']} | {row['mode']} | {_human_bytes(row['size_bytes'])} | {row['accuracy']:.2f} "
                     f"| {row['top1_agreement']:.2f} | {row['latency_ms_batch1']:.3f} | {worst_text} | "
                     f"{'pass' if row['passed'] else 'FAIL: ' + row['reason']} |")
    lines += ["", "| conversion | status | reason |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {c['reason'] or '-'} |" for c in summary["conversions"]]
    lines += [""] + [f"![{name}]({name})" for name in _plots(run, rows)]
    md_path = run.root / "report.md"
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return json_path, md_path


def summary_tables(summary: dict[str, Any], records: list[StageRecord]):
    """Rich tables for the terminal: stages, artifacts (accuracy, parity, size), publish."""
    from rich.table import Table

    stages = Table(title="stages")
    for column in ("stage", "status", "seconds", "note"):
        stages.add_column(column)
    for record in records:
        stages.add_row(record.name, record.status.value, f"{record.seconds:.1f}", record.reason[:120])
    artifacts = Table(title="artifacts (held-out test split, compared by output name with the SavedModel)")
    for column in ("artifact", "mode", "size", "accuracy %", "agree %", "logits err",
                   "probs err", "class_id", "verdict"):
        artifacts.add_column(column)
    for row in summary["parity"]["artifacts"]:
        outputs = {o["output"]: o for o in row["outputs"]}
        class_row = outputs.get("class_id", {})
        artifacts.add_row(row["artifact"], row["mode"], _human_bytes(row["size_bytes"]), f"{row['accuracy']:.2f}",
                          f"{row['top1_agreement']:.2f}",
                          f"{outputs.get('logits', {}).get('max_abs_error', float('nan')):.2e}",
                          f"{outputs.get('probabilities', {}).get('max_abs_error', float('nan')):.2e}",
                          "equal" if class_row.get("passed") and not class_row.get("detail") else
                          class_row.get("detail", "-") or "-",
                          "pass" if row["passed"] else "FAIL")
    return stages, artifacts


def load_summary(run: RunFolder) -> dict[str, Any]:
    """Read a finished run's `summary.json`."""
    return json.loads((run.root / "summary.json").read_text(encoding="utf-8"))
