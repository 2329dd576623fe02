"""Results of `bench.serve.run_bench`: targets, JSON, Markdown table and plot.

Rows (`doc["rows"]`) are dicts with `mode` (`server`, `identity`, `multiprocess`, `inprocess`),
`model`, `backend`, `batching` and the load generator's fields (`inferences_per_s`, `latency_ms`
in milliseconds, `server_cpu`/`loadgen_cpu` in cores, `errors`), or for `inprocess` rows `batch`
and `inferences_per_s`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def host_info() -> dict:
    """CPU count, 1-minute load average (a busy machine makes every figure noisy), git commit."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "loadavg_1m": os.getloadavg()[0],
        "git_commit": commit,
    }


def _find(rows, **want) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in want.items())), None)


def targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, evaluated per backend (reported, never asserted)."""
    out = []
    for backend in sorted({r["backend"] for r in rows if r["mode"] == "server"}):
        on = _find(rows, mode="server", model="mlp", backend=backend, batching=True, concurrency=32)
        off = _find(rows, mode="server", model="mlp", backend=backend, batching=False, concurrency=32)
        if on and off and on.get("latency_ms"):
            ratio = on["inferences_per_s"] / max(off["inferences_per_s"], 1e-9)
            tail = on["latency_ms"]["p99"] / on["latency_ms"]["p50"]
            out += [
                {
                    "target": f"mlp/{backend} batching c=32 >= 4000 inf/s",
                    "value": on["inferences_per_s"],
                    "met": on["inferences_per_s"] >= 4000,
                },
                {
                    "target": f"mlp/{backend} batching on/off at c=32 >= 1.8x",
                    "value": ratio,
                    "met": ratio >= 1.8,
                },
                {"target": f"mlp/{backend} batching c=32 p99 <= 3x p50", "value": tail, "met": tail <= 3},
            ]
        on1 = _find(rows, mode="server", model="digits", backend=backend, batching=True, concurrency=1)
        off1 = _find(rows, mode="server", model="digits", backend=backend, batching=False, concurrency=1)
        if on1 and off1:
            ratio = on1["inferences_per_s"] / max(off1["inferences_per_s"], 1e-9)
            out.append(
                {
                    "target": f"digits/{backend} c=1 batching on/off >= 0.95 (no slower; 5% noise allowance)",
                    "value": ratio,
                    "met": ratio >= 0.95,
                }
            )
    return out


def markdown(doc: dict) -> str:
    """The result document as Markdown: conditions, targets, one table per mode."""
    rows, host = doc["rows"], doc["host"]
    plan = doc["plan"]
    lines = [
        f"# Serving benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(doc['started']))})",
        "",
        (
            f"git {host['git_commit']}, {host['cpus']} CPUs, load average at end {host['loadavg_1m']:.2f}; "
            f"window {plan['window_s']} s after {plan['warmup_s']} s warm-up; server pinned to core 0 "
            f"(flags {' '.join(doc['server_flags'])}), load generator to core 1; batch-1 requests."
        ),
        "",
        "## Targets (reported, not asserted)",
        "",
        "| target | value | met |",
        "|---|---:|:---:|",
    ]
    lines += [f"| {t['target']} | {t['value']:.2f} | {'yes' if t['met'] else 'no'} |" for t in doc["targets"]]
    lines += [
        "",
        "## Server (closed loop)",
        "",
        (
            "| model | backend | batching | conc. | inf/s | p50 ms | p90 ms | p99 ms | errors | rows/call "
            "| server CPU | loadgen CPU |"
        ),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["mode"] not in ("server", "identity", "multiprocess") or "error" in r:
            continue
        lat = r.get("latency_ms") or {}
        backend = "identity" if r["mode"] == "identity" else r["backend"]
        backend += f" x{r['servers']} procs" if r["mode"] == "multiprocess" else ""
        lines.append(
            f"| {r['model']} | {backend} | {'on' if r['batching'] else 'off'} | {r['concurrency']} | "
            f"{r['inferences_per_s']:.0f} | {lat.get('p50', 0):.2f} | {lat.get('p90', 0):.2f} | "
            f"{lat.get('p99', 0):.2f} | {r['errors']} | {r['mean_batch_rows'] or 0:.1f} | {r['server_cpu'] or 0:.2f} | {r['loadgen_cpu']:.2f} |"
        )
    failed = [r for r in rows if "error" in r]
    lines += [f"\nFailed case {r['mode']} {r['model']}/{r['backend']}: {r['error']}" for r in failed]
    lines += [
        "",
        "## In-process limit (no RPC, one thread, core 0)",
        "",
        "| model | backend | batch | inf/s | ms per call |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['model']} | {r['backend']} | {r['batch']} | {r['inferences_per_s']:.0f} | {r['call_ms']:.3f} |"
        for r in rows
        if r["mode"] == "inprocess"
    ]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    """inferences/s vs concurrency, one panel per model; dashed: in-process batch 32 and identity ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        series = sorted(
            {
                (r["mode"], r["backend"], r["batching"])
                for r in rows
                if r["model"] == model and r["mode"] in ("server", "identity") and "error" not in r
            }
        )
        for mode, backend, batching in series:
            pts = sorted(
                (r["concurrency"], r["inferences_per_s"])
                for r in rows
                if r["model"] == model
                and (r["mode"], r["backend"], r.get("batching")) == (mode, backend, batching)
            )
            label = (
                f"{'identity' if mode == 'identity' else backend} {'batched' if batching else 'per-request'}"
            )
            ax.plot(*zip(*pts), marker="o", linestyle=":" if mode == "identity" else "-", label=label)
        for r in rows:
            if r["model"] == model and r["mode"] == "inprocess" and r["batch"] == 32:
                ax.axhline(r["inferences_per_s"], linestyle="--", linewidth=0.8, color="grey")
                ax.text(1, r["inferences_per_s"], f" in-process {r['backend']} b32", fontsize=7, va="bottom")
        ax.set(
            title=f"{model}: server on 1 core, batch-1 requests",
            xscale="log",
            yscale="log",
            xlabel="concurrency (requests in flight)",
            ylabel="inferences/s",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc: dict, out: Path) -> list[Path]:
    """Add targets; write serve-<timestamp>.json, serve-latest.json/.md/.png under `out`; returns the paths."""
    doc = {**doc, "targets": targets(doc["rows"])}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(doc["started"]))
    text = json.dumps(doc, indent=1, default=str)
    paths = [
        out / f"serve-{stamp}.json",
        out / "serve-latest.json",
        out / "serve-latest.md",
        out / "serve-latest.png",
    ]
    for p in paths[:2]:
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(p)
    paths[2].write_text(markdown(doc))
    plot(doc, paths[3])
    return paths
