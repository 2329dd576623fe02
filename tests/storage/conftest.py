"""The bucket tests' fixtures: the S3 server (tests/s3_server.py) and two candidate version folders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.s3_server import bucket, s3_endpoint, s3_env

__all__ = ["bucket", "s3_endpoint", "s3_env"]


@pytest.fixture(scope="session")
def version_folders(tmp_path_factory) -> tuple[Path, Path]:
    """Two candidate version folders (SavedModel + ONNX + TFLite + warm-up; bias 0 and bias 1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
    import model_factory

    root = tmp_path_factory.mktemp("candidates")
    return (model_factory.build_version(root / "a", seed=0, bias=0.0),
            model_factory.build_version(root / "b", seed=0, bias=1.0))
