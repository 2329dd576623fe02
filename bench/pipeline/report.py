"""Results of `bench.pipeline.run_bench`: Markdown table, plot and JSON under `bench/results/`.

Each record (one model size) holds `stages[name] = {wall_s, peak_rss (bytes), returncode, result}` and
`serve[backend] = {load_s, first_request_ms, rss, rss_over_identity}`. Peak RSS is of the stage's process
and every process below it; "x weights" divides it by the model's float32 weight bytes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.host import host_info, uptime
from bench.pipeline.main_job import markdown_lines

__all__ = ["host_info", "markdown", "plot", "uptime", "write"]
MB = 1e6


def _stage_cell(entry: dict | None, weights: float) -> str:
    if entry is None:
        return "skipped"
    if entry["returncode"] != 0:
        return f"FAILED ({entry['wall_s']:.1f} s)"
    status = ((entry.get("result") or {}).get("detail") or {}).get("status")
    note = f" {status}" if status and status != "produced" else ""
    return f"{entry['wall_s']:.1f} s / {entry['peak_rss'] / MB:,.0f} MB ({entry['peak_rss'] / weights:.1f}x){note}"


def _model_label(model: dict) -> str:
    return model.get("label") or f"width {model['width']}"


def _size_label(size) -> str:
    return f"{size:g} MB" if isinstance(size, (int, float)) else str(size)


def convert_plan_lines(record: dict) -> list[str]:
    """The convert stage's memory plan: budget, and per conversion its predicted and measured peak and timing."""
    plan = (((record.get("stages", {}).get("convert") or {}).get("result") or {}).get("detail") or {}).get("memory_plan")
    if not plan or not plan.get("rows"):
        return []
    rows = ", ".join(f"{r['name']} {r['measured_bytes'] / MB:,.0f} MB (predicted {r['predicted_bytes'] / MB:,.0f}; "
                     f"{r['start_s']:.0f}-{r['end_s']:.0f} s{'; waited for memory' if r['waited_for_memory'] else ''})"
                     for r in plan["rows"])
    tree = record["stages"]["convert"]["peak_rss"]
    return [f"\nConvert stage at {_size_label(record['size_mb'])}: whole process tree peaked at {tree / MB:,.0f} MB; "
            f"memory budget {plan['budget_bytes'] / MB:,.0f} MB ({plan['budget_source']}), up to {plan['workers']} "
            f"at once. Child peaks: {rows}."]


def markdown(doc: dict) -> str:
    """Stage table (rows: stages; columns: sizes), server table, skips and failures."""
    records, host = doc["records"], doc["host"]
    sizes = [r for r in records if "model" in r]
    lines = [f"# Pipeline costs by model size ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(doc['started']))})",
             "", f"git {host['git_commit']}, {host['cpus']} CPUs. Machine load: before `{host['uptime_before']}`; "
             f"after `{host['uptime_after']}`.", "",
             "Each cell: wall seconds / peak RSS of the stage's process and its children (multiple of the float32 "
             "weight bytes). Every stage runs alone in a fresh process (Python + TensorFlow imports included).", "",
             "| stage | " + " | ".join(f"{r['model']['weight_bytes'] / MB:,.1f} MB ({_model_label(r['model'])})"
                                       for r in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    names = []
    for r in sizes:
        names += [n for n in (*r["stages"], *r["skipped"]) if n not in names]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_stage_cell(r["stages"].get(name), r["model"]["weight_bytes"])
                                                 for r in sizes) + " |")
    lines += ["", "## Served (published version, one process, all threads)", "",
              "| backend | " + " | ".join(f"{r['model']['weight_bytes'] / MB:,.1f} MB" for r in sizes) + " |",
              "|---|" + "---:|" * len(sizes)]
    for backend in ("identity", "saved_model", "onnx", "tflite"):
        cells = []
        for r in sizes:
            s = r["serve"].get(backend) or {}
            if "error" in s or not s:
                cells.append(s.get("error", "-")[:80])
                continue
            over = s.get("rss_over_identity")
            cells.append(f"load {s['load_s']:.1f} s, first {s['first_request_ms']:.1f} ms, RSS {s['rss'] / MB:,.0f} MB"
                         + (f" (+{over / MB:,.0f} MB = {over / r['model']['weight_bytes']:.1f}x)" if over else ""))
        lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    for r in sizes:
        ok = {n: e for n, e in r["stages"].items() if e["returncode"] == 0}
        if ok:
            name, top = max(ok.items(), key=lambda kv: kv[1]["peak_rss"])
            slow, longest = max(ok.items(), key=lambda kv: kv[1]["wall_s"])
            lines.append(f"\nAt {r['model']['weight_bytes'] / MB:,.0f} MB of weights the largest peak is {name}: "
                         f"{top['peak_rss'] / MB:,.0f} MB ({top['peak_rss'] / r['model']['weight_bytes']:.1f}x the "
                         f"weights); the longest stage is {slow} ({longest['wall_s']:.0f} s).")
    for r in records:
        lines += convert_plan_lines(r)
        for name, entry in r.get("stages", {}).items():
            if entry.get("rerun_at"):
                lines.append(f"\nAt {_size_label(r['size_mb'])}, {name} and the served rows were measured again at "
                             f"{time.strftime('%H:%M UTC', time.gmtime(entry['rerun_at']))}, after the run: in the run "
                             "it failed only because the skipped convert stage had written no convert.json (the "
                             "single conversions now record their outcomes there).")
        for name, why in r.get("skipped", {}).items():
            lines.append(f"\nSkipped at {_size_label(r['size_mb'])}: {name}: {why}")
        if "error" in r:
            lines.append(f"\nFailed at {_size_label(r['size_mb'])}: {r['error'][-800:]}")
        for name, entry in r.get("stages", {}).items():
            if entry["returncode"] != 0:
                lines.append(f"\n{_size_label(r['size_mb'])} {name} exit {entry['returncode']}:\n```\n{entry['tail']}\n```")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    """Two panels: seconds and peak RSS per stage against weight size (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r for r in doc["records"] if "model" in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = sorted({n for r in sizes for n in r["stages"]})
    for name in names:
        pts = [(r["model"]["weight_bytes"] / MB, r["stages"][name]) for r in sizes
               if name in r["stages"] and r["stages"][name]["returncode"] == 0]
        if pts:
            left.plot([p[0] for p in pts], [p[1]["wall_s"] for p in pts], marker="o", label=name)
            right.plot([p[0] for p in pts], [p[1]["peak_rss"] / MB for p in pts], marker="o", label=name)
    right.plot([r["model"]["weight_bytes"] / MB for r in sizes], [r["model"]["weight_bytes"] / MB for r in sizes],
               color="grey", linestyle=":", label="1x weights")
    left.set(xscale="log", yscale="log", xlabel="weights, MB", ylabel="seconds", title="stage time")
    right.set(xscale="log", yscale="log", xlabel="weights, MB", ylabel="peak RSS, MB", title="stage peak memory")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc: dict, out: Path) -> list[Path]:
    """pipeline-<timestamp>.json, pipeline-latest.json/.md/.png under `out`; returns the paths."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(doc["started"]))
    paths = [out / f"pipeline-{stamp}.json", out / "pipeline-latest.json", out / "pipeline-latest.md",
             out / "pipeline-latest.png"]
    text = json.dumps(doc, indent=1, default=str)
    for p in paths[:2]:
        p.write_text(text)
    main_job = "\n".join(markdown_lines(doc["main_job"])) + "\n" if doc.get("main_job") else ""
    paths[2].write_text(markdown(doc) + main_job)
    plot(doc, paths[3])
    return paths
