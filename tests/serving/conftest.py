"""Fixtures: tiny models built once per session, and real servers on free ports (ready by health check)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_factory

from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient

MODEL = "digits"


@pytest.fixture(scope="session")
def repository(tmp_path_factory) -> Path:
    """`<repo>/digits/1` (bias 0) and `<repo>/digits/2` (bias 1): SavedModel + tflite + onnx + warmup."""
    repo = tmp_path_factory.mktemp("repo")
    for version, bias in ((1, 0.0), (2, 1.0)):
        model_factory.build_version(repo / MODEL / str(version), seed=0, bias=bias)
    return repo


@pytest.fixture(scope="session")
def model_config_file(repository: Path) -> Path:
    """ModelServerConfig text: all versions of digits, label `stable` -> 1, `canary` -> 2."""
    path = repository / "models.config"
    path.write_text(f"""
model_config_list {{
  config {{
    name: "{MODEL}"
    base_path: "{repository / MODEL}"
    model_platform: "tensorflow"
    model_version_policy {{ all {{}} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
}}
""")
    return path


@pytest.fixture(scope="session")
def server(repository: Path, model_config_file: Path):
    """The main server: backend auto (SavedModel), two versions, labels, REST and metrics on."""
    with ServerProcess(repository, MODEL, extra_args=("--model-config-file", str(model_config_file),
                                                      "--file-system-poll-wait-seconds", "0")) as proc:
        yield proc


@pytest.fixture(scope="session")
def client(server) -> PredictClient:
    with PredictClient(server.grpc_target, timeout_s=30) as c:
        yield c


@pytest.fixture(scope="session")
def images() -> np.ndarray:
    """float32 [5, 8, 8, 1] in [0, 1]."""
    return np.random.default_rng(0).random((5, 8, 8, 1), dtype=np.float32)


def saved_model_outputs(version_dir: Path, inputs: dict[str, np.ndarray], signature: str = "serving_default"):
    """Call the SavedModel directly (the reference every served answer must equal)."""
    import tensorflow as tf

    fn = tf.saved_model.load(str(version_dir)).signatures[signature]
    return {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in inputs.items()}).items()}
