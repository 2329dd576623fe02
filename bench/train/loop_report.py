"""The report of `make bench-train-loop` (`bench/train/loop_vs_fit.py`): the checks against the targets
(PASS/MISS), train-loop-latest.md and the plot.
"""

from __future__ import annotations

import math
from pathlib import Path


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def checks(results: dict) -> list[dict]:
    rows = []
    cases = results["cases"]
    for key, title in (("mlp", "tiny MLP (overhead-bound), tfship / tuned Keras fit"),
                       ("cnn", "digits CNN, tfship / Keras fit"),
                       ("rec", f"recommender {results['settings']['big_table']:,}-row user table, tfship / Keras fit")):
        if key not in cases:
            continue
        s = cases[key]["summary"]
        best = s["reference_best_steps_per_execution"]
        rows.append({"case": key, "measure": title, "tfship": s["tfship_records_per_second"]["median"],
                     "reference": s["reference_records_per_second_by_steps_per_execution"][str(best)]["median"],
                     "reference_detail": f"K={best} of " + ", ".join(
                         f"K={k} {_fmt(v['median'])}"
                         for k, v in s["reference_records_per_second_by_steps_per_execution"].items()),
                     "ratio": s["ratio"], "target": s.get("target"), "pass": s.get("pass")})
    for variant, s in (cases.get("end_to_end") or {}).get("variants", {}).items():
        title = {"cold": "end to end, cold (scan included): marginal records/s of `tfship train` / plain read + parse",
                 "declared": "end to end, split sizes declared (no scan): marginal records/s / plain read + parse"}
        rows.append({"case": f"end_to_end_{variant}", "measure": title[variant],
                     "tfship": (s["marginal_records_per_second"] or {}).get("median"),
                     "reference": s["read_parse_records_per_second"]["median"], "reference_detail": "read + parse",
                     "ratio": s["ratio"], "target": s["target"], "pass": s["pass"]})
    return rows


def markdown(results: dict) -> str:
    host = results["host"]
    lines = ["# `tfship train` against a hand-written Keras fit (`make bench-train-loop`)", "",
             f"Host: {host['cpus']} CPUs, 1-min load {host['loadavg_1m']:.1f} at the start (shared machine), commit "
             f"{host['git_commit']}; `{results['command']}`; {results['repeats']} round(s); {results['seconds']:.0f} s; "
             f"tfship `train.steps_per_execution`: {results['tfship_steps_per_execution']}.", "",
             "Ratios are medians of per-round ratios (each round runs tfship and the reference back to back, in "
             "their own processes); [min, max] over the rounds." + (
                 " **--parallel: a round's processes ran at the same time (a smoke run): the figures are not "
                 "comparable.**" if results["parallel"] else ""), "",
             "| case | tfship records/s | reference records/s | ratio | rounds | target | verdict |",
             "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for c in results["checks"]:
        if c["ratio"] is None:  # the end-to-end marginal at sizes too close to measure (T_N <= T_n)
            lines.append(f"| {c['measure']} | not measurable (T_N <= T_n) | {_fmt(c['reference'])} "
                         f"({c['reference_detail']}) | n/a | | {c['target'] or ''} | NOT MEASURED |")
            continue
        verdict = "" if c["pass"] is None else ("PASS" if c["pass"] else "MISS")
        lines.append(f"| {c['measure']} | {_fmt(c['tfship'])} | {_fmt(c['reference'])} ({c['reference_detail']}) | "
                     f"**{c['ratio']['median']:.3f}** | [{c['ratio']['min']:.3f}, {c['ratio']['max']:.3f}] | "
                     f"{c['target'] or ''} | {verdict} |")
    cases = results["cases"]
    for key in ("mlp", "cnn", "rec"):
        if key not in cases:
            continue
        s = cases[key]["summary"]
        first = cases[key]["rounds"][0]["tfship"]
        lines += ["", f"## {key}", "", f"- tfship figure: {s['tfship_figure']}; whole process "
                  f"{_fmt(s['tfship_whole_process_records_per_second']['median'])} records/s",
                  f"- tfship's layers computed in: {(first['layers'] or {}).get('text', 'unknown (no model.keras)')} "
                  f"(train.mixed_precision {first['mixed_precision']}; read back from model.keras)",
                  f"- reference figure: {s['reference_figure']}; steady (compile excluded) by K: " + ", ".join(
                      f"K={k} {_fmt(v['median'])}"
                      for k, v in s["reference_steady_records_per_second_by_steps_per_execution"].items())]
    if "end_to_end" in cases:
        e2e = cases["end_to_end"]
        lines += ["", "## end to end", "", f"- {e2e['definition']}"]
        for variant, s in e2e["variants"].items():
            rate = s["marginal_records_per_second"]
            walls = ", ".join(f"T_{n} {v['median']:.1f} s" for n, v in s["wall_s"].items())
            loops = ", ".join(f"{n}: {v['median']:.1f} s" for n, v in s["train_loop_seconds"].items())
            scans = "; ".join(f"{n}: {', '.join(v)}" for n, v in s["scan"].items())
            lines.append(f"- **{variant}** ({s['what']}): marginal {_fmt(rate['median']) if rate else 'n/a'} "
                         f"records/s ({s['marginal_rounds_measured']} rounds measurable); {walls}; train loop "
                         f"{loops}; the scan: {scans}; scan seconds {s['scan_seconds']}")
    if "modes" in cases:
        m = cases["modes"]
        lines += ["", f"## The recommender through `tfship train` ({m['steps']} steps of batch {m['batch']}, eager "
                  f"{m['eager_steps']})", "", "| mode | precision | user table rows | records/s | ms/step | "
                  "whole-process records/s | layers computed in |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for r in m["rows"].values():
            lines.append(f"| {r['mode']} | {r['precision']} | {r['user_table_rows']:,} | "
                         f"{_fmt(r['records_per_second']['median'])} | {r['ms_per_step']['median']:.1f} | "
                         f"{_fmt(r['whole_process_records_per_second']['median'])} | "
                         f"{(r.get('layers') or {}).get('text', r['model_dtype_policy'])} |")
        lines += ["", "| ratio | median | [min, max] |", "| --- | ---: | --- |"]
        lines += [f"| {k} | {v['median']:.3f} | [{v['min']:.3f}, {v['max']:.3f}] |"
                  for k, v in next(iter(m["ratios"].values())).items()]
        lines += [f"\n- {note}" for note in m["notes"]]
        lines.append(f"- figure: {next(iter(m['rows'].values()))['figure']}")
    lines += ["", "![ratios](train-loop-latest.png)", ""]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["checks"] if r["ratio"] is not None]  # an unmeasurable end to end: not drawn
    modes = results["cases"].get("modes")
    figure, axes = plt.subplots(1, 2 if modes else 1, figsize=(12 if modes else 7, 4.5), squeeze=False)
    axis = axes[0][0]
    names = [r["case"] for r in rows]
    values = [r["ratio"]["median"] for r in rows]
    errors = [[v - r["ratio"]["min"] for v, r in zip(values, rows, strict=True)],
              [r["ratio"]["max"] - v for v, r in zip(values, rows, strict=True)]]
    colours = ["tab:gray" if r["pass"] is None else ("tab:green" if r["pass"] else "tab:red") for r in rows]
    axis.barh(names, values, xerr=errors, color=colours)
    for i, r in enumerate(rows):
        if r["target"]:
            target = float(r["target"].split()[-1])
            axis.plot([target, target], [i - 0.4, i + 0.4], color="black", linestyle="--")
    axis.set_xlabel("tfship / reference (records/s, median of rounds; dashed: target)")
    axis.set_title("tfship train vs Keras fit / plain read")
    if modes:
        axis = axes[0][1]
        labels = [f"{r['mode']}\n{r['precision'].replace('mixed_', '')}\n{r['user_table_rows'] // 1000}k"
                  for r in modes["rows"].values()]
        axis.bar(range(len(labels)), [r["ms_per_step"]["median"] for r in modes["rows"].values()])
        axis.set_xticks(range(len(labels)), labels, fontsize=7)
        axis.set_ylabel("ms per step (median)")
        axis.set_title("recommender through tfship train")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _finite(tree) -> bool:
    if isinstance(tree, dict):
        return all(_finite(v) for v in tree.values())
    if isinstance(tree, list):
        return all(_finite(v) for v in tree)
    return not isinstance(tree, float) or math.isfinite(tree)


