"""`make bench-pipeline` end to end at a tiny size: every stage runs on the real pipeline code and passes.

The benchmark drives the pipeline's stages one process each; when the pipeline's types change under it,
a stage fails only inside the benchmark's report. This runs the whole harness on a ~0.2 MB model and
checks that every stage exited 0 with its detail, the published version served on every backend, and the
report was written.

One TFLite mode runs as its own stage (`tflite_int8`: the harness's one-conversion path, with calibration data);
the other modes run once, inside the whole `convert` stage, whose per-conversion outcomes are checked here (each
`tflite_<mode>` stage would convert the same file again through the same harness code).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("export", "audit", "onnx", "tflite_int8", "convert", "validate", "serve_check", "publish")
CONVERSIONS = ("onnx", "tflite_float32", "tflite_float16", "tflite_dynamic_range", "tflite_int8")


def test_every_stage_of_the_pipeline_benchmark_runs(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.pipeline.run_bench", "--sizes", "0.2", "--work", str(tmp_path / "work"),
           "--out", str(tmp_path / "out"), "--timeout-s", "300", "--no-main-job", "--stages", ",".join(STAGES)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = json.loads((tmp_path / "out" / "pipeline-latest.json").read_text())["records"]
    assert not record.get("error"), record.get("error")
    failed = {name: stage.get("tail", "")[-800:] for name, stage in record["stages"].items() if stage["returncode"]}
    assert not failed, failed
    stages = record["stages"]
    assert {"export", "audit", "onnx", "convert", "validate", "serve_check", "publish"} <= set(stages)
    assert set(STAGES) <= set(stages)
    converted = stages["convert"]["result"]["detail"]  # every conversion of the convert stage, each mode included
    assert {name: converted[name]["status"] for name in CONVERSIONS} == dict.fromkeys(CONVERSIONS, "produced"), converted
    assert stages["validate"]["result"]["detail"]["passed"] and stages["serve_check"]["result"]["detail"]["passed"]
    assert all(stage["peak_rss"] > 0 and stage["wall_s"] > 0 for stage in stages.values())
    served = record["serve"]
    assert {"saved_model", "onnx", "tflite"} <= set(served), served
    text = (tmp_path / "out" / "pipeline-latest.md").read_text()
    assert "| serve_check |" in text
    plan = stages["convert"]["result"]["detail"]["memory_plan"]  # the convert stage's budget and child peaks
    assert plan["budget_bytes"] > 0 and all(row["measured_bytes"] > 0 for row in plan["rows"])
    assert "Convert stage at 0.2 MB" in text and "memory budget" in text


def test_main_job_section_gives_the_verdict_against_the_target() -> None:
    """The main job's section: PASS only for a run that exited 0 within the target; stage and conversion rows."""
    from bench.pipeline.main_job import markdown_lines

    record = {"returncode": 0, "seconds": 24.9, "target_s": 25.0, "uptime_before": "load 1", "uptime_after": "load 2",
              "stages": {"train": 7.3, "convert": 8.1},
              "conversions": [{"name": "tflite_int8", "start_s": 6.0, "end_s": 7.1, "measured_bytes": 700 * 2**20}]}
    text = "\n".join(markdown_lines(record))
    assert "**PASS**" in text and "| convert | 8.1 |" in text and "| tflite_int8 | 6.0 | 7.1 | 700 |" in text
    assert "**MISS**" in "\n".join(markdown_lines({**record, "seconds": 25.1}))
    assert "**MISS**" in "\n".join(markdown_lines({**record, "returncode": 1}))
