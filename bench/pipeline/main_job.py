"""The main job in `make bench-pipeline`: `tfship run` on digits (what `make pipeline` runs), timed whole and
by stage, with the convert stage's conversions (start, end, peak) from its memory plan.

The command is `make pipeline`'s (`tfship run --config configs/digits.toml`) into a scratch repository and
runs folder under the bench's work folder; its stage times are the run's own `stages.json`. The target is
issue 31's: the whole run in 25 s or less on the 2-core build machine (load noted beside it, since the
machine is shared).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 25.0


def run_main_job(root: Path, work: Path, env: dict[str, str], uptime) -> dict:
    """Run it once; the record: seconds, exit status, load before/after, stage seconds, conversion rows."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [str(Path(sys.executable).with_name("tfship")), "run", "--config", str(root / "configs" / "digits.toml"),
               "--repository", str(work / "models"), "--runs-dir", str(work / "runs")]
    print("[bench-pipeline] main job: tfship run --config configs/digits.toml", flush=True)
    before, started = uptime(), time.monotonic()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    record = {"command": "tfship run --config configs/digits.toml (make pipeline)", "returncode": done.returncode,
              "seconds": round(time.monotonic() - started, 1), "target_s": TARGET_S, "uptime_before": before,
              "uptime_after": uptime(), "stages": {}, "conversions": []}
    runs = sorted((work / "runs").glob("*"))
    if done.returncode != 0 or not runs:
        record["tail"] = (done.stdout + done.stderr)[-2000:]
        return record
    record["stages"] = {s["name"]: round(s["seconds"], 1) for s in json.loads((runs[-1] / "stages.json").read_text())}
    plan = runs[-1] / "convert_memory.json"
    if plan.is_file():
        record["conversions"] = json.loads(plan.read_text())["rows"]
    return record


def markdown_lines(record: dict) -> list[str]:
    """The main job's section of pipeline-latest.md."""
    verdict = "PASS" if record["returncode"] == 0 and record["seconds"] <= record["target_s"] else "MISS"
    lines = ["", "## The main job: `tfship run` on digits (`make pipeline`)", "",
             f"{record['seconds']:.1f} s in all, target <= {record['target_s']:g} s: **{verdict}** (exit "
             f"{record['returncode']}). Load before `{record['uptime_before']}`; after `{record['uptime_after']}`.",
             "", "| stage | seconds |", "|---|---:|"]
    lines += [f"| {name} | {seconds:.1f} |" for name, seconds in record["stages"].items()]
    if record["conversions"]:
        lines += ["", "Convert stage (TFLite's modes run in turn in one warm child, `core.warm_children`):", "",
                  "| conversion | start s | end s | peak MB |", "|---|---:|---:|---:|"]
        lines += [f"| {r['name']} | {r['start_s']:.1f} | {r['end_s']:.1f} | {r['measured_bytes'] / 2**20:,.0f} |"
                  for r in record["conversions"]]
    if record.get("tail"):
        lines += ["", "```", record["tail"], "```"]
    return lines
