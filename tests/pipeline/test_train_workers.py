"""`tfship train --workers N`: the multi-worker recipe as one command (configs/digits-2workers.toml), exit code
= the worst worker's, and no worker outlives the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

from tests.pipeline.conftest import REPO_ROOT, run_tfship
from tfship.pipeline.training.workers import WorkerResult, tf_config, worst_exit_code

CONFIG = str(REPO_ROOT / "configs" / "digits-2workers.toml")


def _tensorboard_tags(folder: Path) -> set[str]:
    return {value.tag for path in folder.glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(path)) for value in event.summary.value}


@pytest.mark.slow
def test_two_local_workers_train_the_two_worker_config(tmp_path):
    completed = run_tfship("train", "--config", CONFIG, "--workers", "2", "--epochs", "2",
                           "--runs-dir", str(tmp_path / "runs"), timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "workers' exit codes: 0: 0, 1: 0" in completed.stdout
    (chief,) = (tmp_path / "runs").iterdir()  # the other worker's folder is temporary
    train = json.loads((chief / "train.json").read_text())
    assert train["strategy"] == "multi_worker" and train["replicas"] == 2 and train["global_batch"] == 128
    assert train["steps"] == 18 and train["train_step_traces"] == 1 and (chief / "model.keras").is_file()
    # step 10 logged the learning rate and loss scale read through the strategy (MirroredVariable before)
    assert {"learning_rate", "loss_scale", "loss"} <= _tensorboard_tags(chief / "tensorboard" / "train")


def test_a_failing_worker_fails_the_launch_with_its_code(tmp_path):
    completed = run_tfship("train", "--config", CONFIG, "--workers", "2", "--set", "data.batch_size=4096",
                           "--runs-dir", str(tmp_path / "runs"), timeout=300)
    assert completed.returncode == 2, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "global batch 8192" in completed.stderr and "worker 1 exited with 2" in completed.stderr


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_workers_die_with_the_launcher(tmp_path):
    """kill -9 of the launcher: no worker survives, and its temp folder (worker logs and checkpoints) is removed
    by the next `tfship` command."""
    temp = tmp_path / "temp"  # the launcher's TMPDIR
    temp.mkdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(temp)}
    launcher = subprocess.Popen([sys.executable, "-m", "tfship.pipeline.cli", "train", "--config", CONFIG, "--workers", "2",
                                 "--runs-dir", str(tmp_path / "runs")], cwd=REPO_ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(children := _children(launcher.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(children) == 2, children
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if Path(f"/proc/{c}").exists() and "Z" not in _state(c)]
    assert len(list(temp.glob("tfship-train-workers-*"))) == 1
    subprocess.run([sys.executable, "-m", "tfship.pipeline.cli", "promote", "--help"], cwd=REPO_ROOT, env=env,
                   check=True, capture_output=True)
    assert not list(temp.glob("tfship-train-workers-*"))


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_tf_config_and_exit_codes():
    assert json.loads(tf_config([1001, 1002], 1)) == {
        "cluster": {"worker": ["127.0.0.1:1001", "127.0.0.1:1002"]}, "task": {"type": "worker", "index": 1}}
    assert worst_exit_code([WorkerResult(0, 0, None), WorkerResult(1, 0, None)]) == 0
    assert worst_exit_code([WorkerResult(0, 2, None), WorkerResult(1, 143, None)]) == 143
