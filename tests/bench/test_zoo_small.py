"""`make zoo`'s small members end to end, in `make test`: a tiny MobileNetV3, the GRU and the two-signature
`tf.Module`, each through one export route and a real `tfship run --model ... --data ...` (ONNX and TFLite
float32 only, to stay within a minute or two on a quiet machine).

Checked: each model is built (random weights, BatchNorm statistics set), each run publishes (the
SavedModel at least), every artifact left out has a one-line reason, and the table (JSON + Markdown) has
a row per run with its time, peak memory and the commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = (("mobilenetv3small_tiny", "keras"), ("gru", "export"), ("two_signatures", "saved_model"))


@pytest.mark.slow
@pytest.mark.parametrize(("member", "route"), RUNS)
def test_small_zoo_member_publishes_with_one_line_reasons(member: str, route: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bench.zoo.run_zoo", "--members", member, "--routes", route, "--work",
           str(tmp_path / "work"), "--out", str(out), "--set", 'convert.tflite_modes=["float32"]']
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=900)
    doc = json.loads((out / "zoo-latest.json").read_text())
    [row] = doc["rows"]
    assert row["status"] in ("published", "partial"), (row["error"], done.stdout[-2000:])
    assert done.returncode == 0
    assert row["artifacts"]["saved_model"]["status"] == "published"
    assert {"onnx", "tflite_float32"} <= set(row["artifacts"])
    for name, outcome in row["artifacts"].items():
        if outcome["status"] != "published":
            assert outcome["reason"] and "\n" not in outcome["reason"] and len(outcome["reason"]) <= 160, name
    assert row["seconds"] > 0 and row["peak_rss_bytes"] > 0
    table = (out / "zoo-latest.md").read_text()
    assert f"| {member} | {route} |" in table and doc["commit"] in table
