"""`tfship.serve` and `tfship.Client` in the TensorFlow-free base install (`.venv-edge`, the README's
`pip install -c requirements.lock .`): a real server, answers over gRPC and REST, no TensorFlow loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SERVING_TESTS = Path(__file__).resolve().parents[1] / "serving"
sys.path.insert(0, str(SERVING_TESTS))

import model_factory  # noqa: E402  (tests/serving helpers, imported by path as tests/serving does)
from edge_venv import ensure_edge_venv  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, numpy as np, tfship
images = np.load(sys.argv[2])["image"]
with tfship.serve(sys.argv[1], backend="onnx") as served:
    with served.client("grpc") as grpc_client:
        by_grpc = grpc_client.predict(images)
        assert list(grpc_client.metadata()) == ["serving_default"]
    by_rest = served.client("rest").predict({"image": images})
    for name in ("logits", "class_id"):
        np.testing.assert_allclose(by_grpc[name], by_rest[name], atol=1e-6)
    try:
        served.client("rest").predict(images, "nope")
    except Exception as err:  # the unknown model: a RestError carrying HTTP 404
        print(type(err).__name__, getattr(err, "http_status", None))
assert "tensorflow" not in sys.modules and "keras" not in sys.modules, "TensorFlow was imported"
np.savez(sys.argv[3], **by_rest)
"""


def test_serve_and_client_work_without_tensorflow(tmp_path):
    edge_python = ensure_edge_venv()
    repository = tmp_path / "repo"
    model_factory.build_version(repository / "digits" / "1")
    images = np.random.default_rng(0).random((3, 8, 8, 1), dtype=np.float32)
    np.savez(tmp_path / "images.npz", image=images)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy, not the sources
    done = subprocess.run([str(edge_python), "-c", SCRIPT, str(repository), str(tmp_path / "images.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "RestError 404", done.stdout
    with np.load(tmp_path / "out.npz") as outputs:
        assert outputs["logits"].shape == (3, 10) and outputs["class_id"].dtype == np.int64
