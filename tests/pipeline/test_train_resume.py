"""Kill a real `tfship train` process after a checkpoint, resume it with `tfship train --resume`,
and get the same final weights as an uninterrupted run (determinism on)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.conftest import REPO_ROOT, run_tfship

pytestmark = pytest.mark.slow

COMMON = ("--set", "train.deterministic=true", "--set", "train.jit_compile=false", "--set",
          "train.checkpoint_every_steps=20", "--set", "train.epochs=12")


def _weights(run: Path) -> list[np.ndarray]:
    import keras

    return keras.models.load_model(run / "model.keras").get_weights()


def test_killed_training_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    full = run_tfship("train", *COMMON, "--runs-dir", str(tmp_path / "full"))
    assert full.returncode == 0, full.stdout[-2000:] + full.stderr[-2000:]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "400", "PYTHONUNBUFFERED": "1"}
    command = [str(Path(sys.executable).with_name("tfship")), "train", *COMMON, "--runs-dir", str(tmp_path / "cut")]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env)
    seen = []
    for line in process.stdout:  # readiness from the process's own report, no sleeping
        seen.append(line)
        if "checkpoint saved: step 40 " in line:
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=120)
    assert process.returncode == -signal.SIGKILL, "".join(seen)[-2000:]
    (run,) = (tmp_path / "cut").iterdir()
    assert not (run / "model.keras").exists(), "training finished before it was killed"
    resumed = run_tfship("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in (run / "logs" / "train.log").read_text()
    (full_run,) = (tmp_path / "full").iterdir()
    for a, b in zip(_weights(full_run), _weights(run)):
        np.testing.assert_array_equal(a, b)


def test_run_resume_skips_complete_stages_and_reruns_from_the_first_incomplete(pipeline_run):
    run = pipeline_run["run"]
    repository = pipeline_run["repository"]
    again = run_tfship("run", "--resume", run.name, "--runs-dir", str(run.parent))
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    stages = json.loads((run / "stages.json").read_text())
    assert all(s["status"] == "ok" and s["summary"].get("skipped") for s in stages if s["name"] != "data")
    assert sorted(p.name for p in (repository / "digits").iterdir()) == ["1"]
    (run / "serve_check.json").unlink()
    partial = run_tfship("run", "--resume", str(run))
    assert partial.returncode == 0, partial.stdout[-2000:] + partial.stderr[-2000:]
    stages = {s["name"]: s for s in json.loads((run / "stages.json").read_text())}
    assert stages["validate"]["summary"].get("skipped") and not stages["serve-check"]["summary"].get("skipped")
    assert json.loads((run / "summary.json").read_text())["version"] == 2
