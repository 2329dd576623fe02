"""MultiWorkerMirroredStrategy: two `tfship train` worker processes on loopback (free ports) train
digits together; the chief's model passes the same export audit and parity gate as any run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.conftest import REPO_ROOT
from tfship.pipeline.config import load_config
from tfship.pipeline.data.splits import load_split_arrays
from tfship.pipeline.orchestration.stages import RunFolder

pytestmark = pytest.mark.slow


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_two_workers_train_and_the_chief_model_passes_audit_and_parity(tmp_path):
    from tfship.pipeline.orchestration import steps

    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    overrides = ("--set", "train.strategy=multi_worker", "--set", "train.epochs=6", "--set", "train.tensorboard=false")
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "300"}
        command = [str(Path(sys.executable).with_name("tfship")), "train", *overrides,
                   "--runs-dir", str(tmp_path / f"worker{index}")]
        processes.append(subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    (chief,) = (tmp_path / "worker0").iterdir()
    train = json.loads((chief / "train.json").read_text())
    assert train["strategy"] == "multi_worker" and train["replicas"] == 2 and train["global_batch"] == 128
    assert train["train_step_traces"] == 1 and train["test_accuracy"] > 0.85

    config = load_config(None, {"train.strategy": "multi_worker", "convert.tflite_modes": ["float32"]})
    splits = load_split_arrays(config.data, config.run.seed)
    run = RunFolder(chief)
    outcome = steps.export_stage(config, run, splits)
    assert outcome.audit.passed
    steps.convert_stage(config, run, splits)
    report = steps.validate_stage(config, run, splits)
    assert report.passed and {row.artifact for row in report.rows} >= {"tflite_float32"}
