"""`tfship serve --artifact NAME` refuses what cannot name one published file, before anything loads (exit 2, one
line): an empty name; a name with another flag choosing the file (`--tflite-file`), by the command line and by
the Python API's `RuntimeOptions` alike; and a name the manifest leaves out, giving the stage only where the
manifest records one. A real ONNX version with the manifest the publish stage writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shadow_models

from tfship.core.errors import ConfigError
from tfship.serving.runtimes import REGISTRY, RuntimeOptions

MODEL = "lin"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """`<repo>/lin/1/model.onnx` published as `onnx`; `tflite_int8` left out by a row with no stage recorded."""
    return shadow_models.write_published_onnx(tmp_path_factory.mktemp("artifact_flags"), MODEL, (
        {"artifact": "tflite_int8", "status": "left out", "file": "model_int8.tflite", "stage": "",
         "reason": "the converter failed"},))


def _serve(repo: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfship.serving", "serve", "--repository", str(repo),
                           "--model-name", MODEL, "--port", "0", "--rest-port", "-1", *flags],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize(("flags", "message"), [
    (("--artifact", ""), "--artifact '': empty; name a published artifact"),
    (("--artifact", "  "), "--artifact '  ': empty; name a published artifact"),
    (("--artifact", "onnx", "--tflite-file", "model_float16.tflite"),
     "--artifact onnx and --tflite-file model_float16.tflite both choose the file to serve"),
    (("--artifact", "tflite_int8"), "lists it as 'left out' (the converter failed); published there: ['onnx']"),
])
def test_refused_in_one_line_before_loading(repo: Path, flags, message) -> None:
    done = _serve(repo, *flags)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "?:" not in lines[0]


def test_python_api_options_are_refused_as_the_flags_are(repo: Path) -> None:
    """`RuntimeOptions(artifact=..., tflite_file=...)` reaches `RuntimeRegistry.create` without the CLI's check:
    the same contradiction is refused there; the artifact alone serves its file."""
    version = repo / MODEL / "1"
    with pytest.raises(ConfigError, match="both choose the file to serve"):
        REGISTRY.create("auto", version, RuntimeOptions(artifact="onnx", tflite_file="model_float16.tflite"))
    with pytest.raises(ConfigError, match="--prefer_tflite_model both choose"):
        REGISTRY.create("auto", version, RuntimeOptions(artifact="onnx", prefer=("tflite",)))
    with pytest.raises(ConfigError, match="empty"):
        REGISTRY.create("auto", version, RuntimeOptions(artifact=""))
    assert REGISTRY.create("auto", version, RuntimeOptions(artifact="onnx")).published.file == "model.onnx"
