"""`make bench-pipeline` end to end at a tiny size: every stage runs on the real pipeline code and passes.

The benchmark drives the pipeline's stages one process each; when the pipeline's types change under it,
a stage fails only inside the benchmark's report. This runs the whole harness on a ~0.2 MB model and
checks that every stage exited 0 with its detail, the published version served on every backend, and the
report was written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_stage_of_the_pipeline_benchmark_runs(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.pipeline.run_bench", "--sizes", "0.2", "--work", str(tmp_path / "work"),
           "--out", str(tmp_path / "out"), "--timeout-s", "300"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = json.loads((tmp_path / "out" / "pipeline-latest.json").read_text())["records"]
    assert not record.get("error"), record.get("error")
    failed = {name: stage.get("tail", "")[-800:] for name, stage in record["stages"].items() if stage["returncode"]}
    assert not failed, failed
    stages = record["stages"]
    assert {"export", "audit", "onnx", "convert", "validate", "serve_check", "publish"} <= set(stages)
    assert stages["validate"]["result"]["detail"]["passed"] and stages["serve_check"]["result"]["detail"]["passed"]
    assert all(stage["peak_rss"] > 0 and stage["wall_s"] > 0 for stage in stages.values())
    served = record["serve"]
    assert {"saved_model", "onnx", "tflite"} <= set(served), served
    text = (tmp_path / "out" / "pipeline-latest.md").read_text()
    assert "| serve_check |" in text
    plan = stages["convert"]["result"]["detail"]["memory_plan"]  # the convert stage's budget and child peaks
    assert plan["budget_bytes"] > 0 and all(row["measured_bytes"] > 0 for row in plan["rows"])
    assert "Convert stage at 0.2 MB" in text and "memory budget" in text
