"""`tfship run --config configs/digits-tfjs.toml`: the TF.js artifact is converted, proven in Node.js by the
parity gate (outputs by name, every batch size), and published as `tfjs/` with hashes, parity and size."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.conftest import REPO_ROOT, run_tfship


@pytest.mark.slow
def test_digits_tfjs_config_publishes_tfjs_with_parity_proven_in_node(tmp_path):
    completed = run_tfship("run", "--config", str(REPO_ROOT / "configs" / "digits-tfjs.toml"),
                           "--set", "train.epochs=2", "--set", 'convert.tflite_modes=["float32"]',
                           "--runs-dir", str(tmp_path / "runs"), "--repository", str(tmp_path / "models"))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    version = tmp_path / "models" / "digits" / "1"
    model_json = json.loads((version / "tfjs" / "model.json").read_text())
    assert sorted(model_json["signature"]["outputs"]) == ["class_id", "logits", "probabilities"]
    manifest = json.loads((version / "manifest.json").read_text())
    rows = {row["artifact"]: row for row in manifest["parity"]["artifacts"]}
    tfjs = rows["tfjs"]
    assert tfjs["passed"] and tfjs["mode"] == "float32" and tfjs["size_bytes"] > 0
    assert sorted(o["output"] for o in tfjs["outputs"]) == ["class_id", "logits", "probabilities"]
    assert all(o["passed"] for o in tfjs["outputs"])
    assert tfjs["metric"] == pytest.approx(rows["onnx"]["metric"], abs=0.5)  # same accuracy as the others
    files = {f["path"]: f for f in manifest["files"]}
    assert "tfjs/model.json" in files and len(files["tfjs/model.json"]["sha256"]) == 64
    assert any(path.startswith("tfjs/group1-shard") for path in files)
    assert tfjs["size_bytes"] == sum(f["size_bytes"] for p, f in files.items() if p.startswith("tfjs/"))
    report = (tmp_path / "runs").glob("*/report.md")
    assert any("| tfjs |" in path.read_text() for path in report)
    assert "tfjs" in completed.stdout  # the summary table lists it
