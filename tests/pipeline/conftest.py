"""Fixtures for the pipeline and signature tests: a 1-epoch model, its export, and one real
`tfship run` (subprocess, the same command `make pipeline` runs) shared by the end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfship.pipeline.config import load_config
from tfship.pipeline.data.splits import load_split_arrays

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST_OVERRIDES = {"train.epochs": 2}


@pytest.fixture(scope="session")
def fast_config():
    """The bundled digits config, trained for 2 epochs."""
    return load_config(None, FAST_OVERRIDES)


@pytest.fixture(scope="session")
def splits(fast_config):
    return load_split_arrays(fast_config.data, fast_config.run.seed)


@pytest.fixture(scope="session")
def trained(fast_config, splits, tmp_path_factory):
    """A `TrainResult` from the real training loop (2 epochs, XLA on)."""
    from tfship.pipeline.training.train import TrainInputs, train_model

    return train_model(TrainInputs(fast_config, splits, tmp_path_factory.mktemp("checkpoints")))


@pytest.fixture(scope="session")
def exported(trained, splits, tmp_path_factory):
    """(SavedModel folder, contract, Keras model) for the trained model."""
    from tfship.signatures.export import build_classifier_module, classifier_contract, export_saved_model

    contract = classifier_contract("image", (8, 8, 1), len(splits.class_names))
    folder = tmp_path_factory.mktemp("export") / "1"
    export_saved_model(build_classifier_module(trained.model, contract), contract, folder)
    return folder, contract, trained.model


def run_tfship(*args: str, cwd: Path = REPO_ROOT, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the installed `tfship` console command (as a user would) and capture its output."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "200"}
    command = [str(Path(sys.executable).with_name("tfship")), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """One real `tfship run` on digits (2 epochs) into a temporary runs folder and repository."""
    root = tmp_path_factory.mktemp("pipeline")
    completed = run_tfship("run", "--set", "train.epochs=2", "--runs-dir", str(root / "runs"),
                           "--repository", str(root / "models"))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    runs = sorted((root / "runs").iterdir())
    return {"root": root, "run": runs[-1], "repository": root / "models", "stdout": completed.stdout}
