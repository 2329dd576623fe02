"""TensorFlow-free path: tfship installed by the README's command (`pip install -c requirements.lock .`) into
a fresh venv, without TensorFlow, serves tflite and onnx and answers `query` (`edge_venv.py`)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from conftest import MODEL, saved_model_outputs
from edge_venv import ensure_edge_venv

from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def edge_python() -> str:
    """`.venv-edge/bin/python` (created once, then reused across sessions)."""
    return str(ensure_edge_venv())


def test_edge_venv_has_no_tensorflow(edge_python, tmp_path):
    code = ("import importlib.util, sys; import tfship.core.protocol, tfship.serving.tfs.client, tfship.serving.server, "
            "tfship.serving.query; assert importlib.util.find_spec('tensorflow') is None; "
            "assert 'site-packages' in tfship.serving.__file__; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy, not the sources
    done = subprocess.run([edge_python, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path, env=env)
    assert done.stdout == "ok\n"


def test_pypi_tflite_parser_and_tfship_import_side_by_side(edge_python, repository, tmp_path):
    """PyPI's `tflite` (installed first) still parses a .tflite file; tfship adds only the name `tfship`."""
    flatbuffer = repository / MODEL / "2" / "model.tflite"
    code = ("import sys, importlib.metadata as md, pathlib, tflite, tfship, tfship.tflite, tfship.serving.server; "
            "assert pathlib.Path(tflite.__file__).parent.name == 'tflite' and 'tfship' not in tflite.__file__; "
            "assert tfship.tflite.__name__ == 'tfship.tflite' and 'tfship' in tfship.tflite.__file__; "
            f"model = tflite.Model.GetRootAsModel(pathlib.Path({str(flatbuffer)!r}).read_bytes(), 0); "
            "assert model.SubgraphsLength() >= 1; "
            "names = {p.parts[0] for p in md.distribution('tfship').files if p.parts[0] != 'bin'}; "
            "print(sorted(n for n in names if not n.endswith('.dist-info') and not n.startswith('..')))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([edge_python, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "['tfship']\n"


@pytest.mark.parametrize("backend", ["tflite", "onnx", "auto"])  # auto without TensorFlow -> onnx
def test_edge_server_serves_and_answers_query(edge_python, repository, backend, images, tmp_path):
    with ServerProcess(repository, MODEL, backend=backend, python=edge_python, installed=True,
                       extra_args=("--rest-port", "-1", "--metrics-port", "-1")) as server:
        assert server.rest_url is None
        with PredictClient(server.grpc_target) as client:
            got = client.predict(MODEL, {"image": images})
            assert list(client.metadata(MODEL)) == ["serving_default"]
        want = saved_model_outputs(repository / MODEL / "2", {"image": images})
        np.testing.assert_array_equal(got["class_id"], want["class_id"])
        np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-5)
        samples = tmp_path / "samples.npz"
        np.savez(samples, image=images, label=want["class_id"])
        query = subprocess.run([edge_python, "-m", "tfship.serving", "query", "--target", server.grpc_target,
                                "--model-name", MODEL, "--samples", str(samples)], capture_output=True, text=True,
                               check=False, cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        assert query.returncode == 0, query.stderr
        assert "accuracy: 1.0000 on 5 rows" in query.stdout
    assert server.returncode == 0


def test_edge_install_names_the_pipeline_extra_for_pipeline_commands(edge_python, tmp_path):
    """`tfship run` in the TensorFlow-free install says which install it needs: exit 2, no traceback."""
    tfship = str(os.path.join(os.path.dirname(edge_python), "tfship"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "digits.toml")
    done = subprocess.run([tfship, "run", "--config", config], capture_output=True, text=True,
                          check=False, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    assert "pip install 'tfship[pipeline]'" in done.stderr and "Traceback" not in done.stderr
