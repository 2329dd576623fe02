"""`make zoo`: real architectures through `tfship run --model ... --data ...`, both export routes, one table.

    python -m bench.zoo.run_zoo [--members a,b] [--small] [--budget-s S] [--set KEY=VALUE ...] [--out DIR]

For each member of `bench.zoo.members.MEMBERS` (architectures nobody here wrote, random weights, BatchNorm
statistics from synthetic photographs; no downloads) and each of its export routes (`keras`: the `.keras`
file, `export`: Keras' `model.export()` SavedModel, `saved_model`: a `tf.Module`'s SavedModel), the model
is built once in a child process, then `python -m tfship.pipeline.cli run --model M --data data.npz` runs
in a fresh child with the default config (ONNX and every TFLite mode), as a user would. Recorded per run:
exit code, wall seconds, the peak resident memory of the run's whole process tree (sampled from /proc
every 50 ms), and every artifact's outcome (published, or left out with its one-line reason) from the
run folder's report.json; a run that published nothing records its error.

Writes `<out>/zoo-latest.json` and `<out>/zoo-latest.md` (the table for users, with the commit it ran
at) and prints a summary table (rich). `--budget-s`: no new run starts once that many seconds have passed
(the rest are listed as not run); runs go breadth first (each member's first route, then the second
routes). `--small`: only the members that `make test` runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.memory import run_sampled
from bench.zoo.members import MEMBERS

ROOT = Path(__file__).resolve().parents[2]
ROUTE_FILES = {"keras": "model.keras", "export": "export", "saved_model": "saved_model"}
REASON_CHARS = 160


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def _measured(command: list[str], timeout_s: float, log: Path) -> dict:
    """Run `command`; wall seconds, peak RSS of its process tree (bytes), exit code, output tail."""
    done = run_sampled(command, timeout_s, log, env=_env(), cwd=ROOT, interval_s=0.05)
    return {"seconds": round(done.seconds, 1), "peak_rss_bytes": done.peak_rss_bytes,
            "returncode": done.returncode, "tail": done.tail(15), "output": done.output}


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """`text` on one line (no newlines or table bars), at most `limit` characters."""
    flat = " ".join(str(text).replace("|", "/").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def build(name: str, work: Path, timeout_s: float) -> dict:
    """Build member `name` into `work/<name>/` once (kept for later runs); returns the build record."""
    folder = work / name
    marker = folder / "built.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    done = _measured([sys.executable, "-m", "bench.zoo.members", name, str(folder)], timeout_s, folder / "build.log")
    result = next((json.loads(line[7:]) for line in done["output"].splitlines() if line.startswith("RESULT ")), None)
    record = {"seconds": done["seconds"], "returncode": done["returncode"], "result": result,
              "error": "" if done["returncode"] == 0 else one_line(done["tail"], 400)}
    if done["returncode"] == 0:
        marker.write_text(json.dumps(record))
    return record


def _run_report(runs: Path) -> dict:
    reports = sorted(runs.glob("*/report.json")) or sorted(runs.glob("*/summary.json"))
    return json.loads(reports[-1].read_text()) if reports else {}


def run_member(name: str, route: str, work: Path, timeout_s: float, overrides: list[str]) -> dict:
    """`tfship run --model` for one member and route; returns its table row (see the module docstring)."""
    folder = work / name
    runs, repository = folder / f"runs-{route}", folder / f"repo-{route}"
    shutil.rmtree(runs, ignore_errors=True)
    shutil.rmtree(repository, ignore_errors=True)
    command = [sys.executable, "-m", "tfship.pipeline.cli", "run", "--model", str(folder / ROUTE_FILES[route]),
               "--data", str(folder / "data.npz"), "--repository", str(repository), "--runs-dir", str(runs),
               "--model-name", f"{name}_{route}"]
    for override in overrides:
        command += ["--set", override]
    done = _measured(command, timeout_s, folder / f"run-{route}.log")
    report = _run_report(runs)
    artifacts = {a["artifact"]: {"status": a["status"], "reason": one_line(a.get("reason") or "")}
                 for a in report.get("artifacts", [])}
    conversions = {c["name"]: c for c in report.get("conversions") or []}
    status = report.get("status") or ("failed" if done["returncode"] else "unknown")
    error = one_line(report.get("error") or ("" if done["returncode"] in (0, 3) else done["tail"]), 400)
    if not artifacts and conversions:  # failed after converting: what each conversion did
        artifacts = {n: {"status": c["status"], "reason": one_line(c.get("reason") or "")} for n, c in conversions.items()}
    memory = report.get("convert_memory") or {}
    return {"member": name, "route": route, "status": status, "returncode": done["returncode"],
            "seconds": done["seconds"], "peak_rss_bytes": done["peak_rss_bytes"], "artifacts": artifacts,
            "error": error, "convert_peak_together_bytes": memory.get("children_peak_together_bytes", 0),
            "run": str(next(iter(sorted(runs.glob("*"))), ""))}


def _git() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return commit + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _outcome_cell(row: dict) -> str:
    if not row["artifacts"]:
        return f"nothing published: {row['error'] or 'see the run folder'}"
    cells = []
    for name, outcome in row["artifacts"].items():
        if outcome["status"] in ("published", "produced"):
            cells.append(f"{name} ✓")
        else:
            cells.append(f"{name} ✗ {outcome['reason'] or outcome['status']}")
    prefix = f"FAILED: {row['error']}; " if row["status"] == "failed" and row["error"] else ""
    return prefix + "; ".join(cells)


def markdown(doc: dict) -> str:
    """The zoo table: architecture | route | per-artifact outcome and error | time | peak memory."""
    lines = [f"# Zoo: real architectures through `tfship run --model` ({doc['date']})", "",
             f"git {doc['commit']}; {doc['cpus']} CPUs, shared machine; "
             + (f"default config with overrides {', '.join(f'`{o}`' for o in doc['overrides'])}" if doc["overrides"]
                else "default config (ONNX + TFLite float32, float16, dynamic_range, int8)") + ".",
             "Random weights, BatchNorm statistics from synthetic photographs (bench/zoo/members.py). ✓ published, "
             "✗ left out with its reason. Time and peak memory are the whole `tfship run` (export, audit, every "
             "conversion, validate, serve-check, publish; process tree).", "",
             "| architecture | route | status | per-artifact outcome and error | time | peak memory |",
             "|---|---|---|---|---:|---:|"]
    for row in doc["rows"]:
        if row.get("not_run"):
            lines.append(f"| {row['member']} | {row['route']} | not run | {row['not_run']} | - | - |")
            continue
        lines.append(f"| {row['member']} | {row['route']} | {row['status']} | {_outcome_cell(row)} | "
                     f"{row['seconds']:.0f} s | {row['peak_rss_bytes'] / 2**30:.1f} GiB |")
    lines += ["", "Members: " + "; ".join(f"`{m.name}`: {m.about}" for m in MEMBERS.values()
                                          if m.name in {r['member'] for r in doc['rows']}) + "."]
    return "\n".join(lines) + "\n"


def summary_table(doc: dict):
    """A rich table of the rows (for the terminal)."""
    from rich.table import Table

    table = Table(title=f"zoo at git {doc['commit']}")
    for column in ("architecture", "route", "status", "published", "left out", "time", "peak"):
        table.add_column(column)
    for row in doc["rows"]:
        if row.get("not_run"):
            table.add_row(row["member"], row["route"], "not run", "-", row["not_run"], "-", "-")
            continue
        published = [n for n, o in row["artifacts"].items() if o["status"] in ("published", "produced")]
        left = [f"{n}: {o['reason'][:60]}" for n, o in row["artifacts"].items() if n not in published]
        table.add_row(row["member"], row["route"], row["status"], ", ".join(published) or "-",
                      "\n".join(left) or (row["error"][:120] if row["error"] else "-"), f"{row['seconds']:.0f} s",
                      f"{row['peak_rss_bytes'] / 2**30:.1f} GiB")
    return table


def _write(args: argparse.Namespace, started: float, commit: str, rows: list[dict]) -> dict:
    doc = {"schema": "tfship.bench.zoo/1", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
           "commit": commit, "cpus": len(os.sched_getaffinity(0)), "overrides": args.overrides,
           "seconds": round(time.time() - started, 1), "rows": rows}
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(doc))
    return doc


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.zoo.run_zoo", description=__doc__.splitlines()[0])
    p.add_argument("--members", default=os.environ.get("ZOO_MEMBERS", ""),
                   help=f"comma-separated members (default: all): {', '.join(MEMBERS)}")
    p.add_argument("--routes", default=os.environ.get("ZOO_ROUTES", ""), help="comma-separated routes (default: all)")
    p.add_argument("--small", action="store_true", help="only the small members (those `make test` runs)")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("ZOO_BUDGET_S") or 0),
                   help="start no new run after this many seconds (0: no limit)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="limit per build or run, seconds")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override passed to every run (tfship run --set)")
    p.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "zoo")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--name", default="zoo-latest", help="output file stem (<out>/<name>.json and .md)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Run the chosen members and routes; write JSON and Markdown; print the summary. Exit 1 if a run failed."""
    from rich.console import Console
    from rich.progress import Progress

    args = parse(argv)
    names = [n.strip() for n in args.members.split(",") if n.strip()] or list(MEMBERS)
    unknown = [n for n in names if n not in MEMBERS]
    if unknown:
        raise SystemExit(f"unknown zoo members {unknown}; known: {list(MEMBERS)}")
    if args.small:
        names = [n for n in names if MEMBERS[n].small]
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    chosen = {n: [r for r in MEMBERS[n].routes if not routes or r in routes] for n in names}
    # breadth first: every member's first route, then every second route (a time budget still sees every member)
    plan = [(n, rs[i]) for i in range(max(map(len, chosen.values()), default=0)) for n, rs in chosen.items()
            if i < len(rs)]
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started, rows, console, commit = time.time(), [], Console(), _git()
    with Progress(console=console) as progress:
        task = progress.add_task("zoo", total=len(plan))
        for name, route in plan:
            if args.budget_s and time.time() - started > args.budget_s:
                rows.append({"member": name, "route": route, "not_run": f"time budget {args.budget_s:.0f} s spent"})
                progress.advance(task)
                continue
            progress.update(task, description=f"{name} ({route}): build")
            built = build(name, args.work, args.timeout_s)
            if built["returncode"] != 0:
                rows.append({"member": name, "route": route, "status": "build failed", "returncode": built["returncode"],
                             "seconds": built["seconds"], "peak_rss_bytes": 0, "artifacts": {},
                             "error": built["error"]})
            else:
                progress.update(task, description=f"{name} ({route}): tfship run")
                rows.append(run_member(name, route, args.work, args.timeout_s, args.overrides))
            progress.advance(task)
            progress.console.print(f"{name} ({route}): {rows[-1].get('status')} in {rows[-1].get('seconds', 0):.0f} s")
            doc = _write(args, started, commit, rows)  # after every run: an interrupted zoo keeps what it measured
    doc = _write(args, started, commit, rows)
    console.print(summary_table(doc))
    console.print(f"{args.out / (args.name + '.md')}")
    return 1 if any(r.get("status") in ("failed", "build failed") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
